"""English spoken forms (engine.normalize.spoken, en-US and en-GB): one row per case."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.normalize import language_family, spoken
from engine.normalize.breaks import glued
from engine.normalize.en import English

US = [
    # amounts and currencies
    ("$120.50", "one hundred twenty dollars and fifty cents"),
    ("$1", "one dollar"),
    ("$1.00", "one dollar"),
    ("$0.50", "fifty cents"),
    ("$0.01", "one cent"),
    ("$5.5", "five dollars and fifty cents"),
    ("€3.20", "three euros and twenty cents"),
    ("£5", "five pounds"),
    ("£1.50", "one pound and fifty pence"),
    ("¥100", "one hundred yen"),
    ("-$5", "minus five dollars"),
    (
        "$1,234,567.89",
        "one million two hundred thirty-four thousand five hundred sixty-seven dollars"
        " and eighty-nine cents",
    ),
    ("USD 20", "twenty dollars"),
    ("20 USD", "twenty dollars"),
    ("RMB 100", "one hundred yuan"),
    ("100元", "one hundred yuan"),
    ("HK$100", "one hundred Hong Kong dollars"),
    ("$1.5 million", "one point five million dollars"),
    ("$2k", "two thousand dollars"),
    ("It costs 3.50 dollars.", "It costs three dollars and fifty cents."),
    ("1 dollars", "one dollar"),
    ("$1.999", "one point nine nine nine dollars"),
    ("50 cents", "fifty cents"),
    # plain numbers
    ("1,234", "one thousand two hundred thirty-four"),
    ("1,000,000", "one million"),
    ("3.14", "three point one four"),
    ("0.5", "zero point five"),
    ("-5", "minus five"),
    ("You have 3 new messages.", "You have three new messages."),
    ("Press 1 for sales, 2 for billing.", "Press one for sales, two for billing."),
    ("press 0 for an operator", "press zero for an operator"),
    ("Version 2.0.1 is out.", "Version two point zero point one is out."),
    ("1-2 business days", "one to two business days"),
    ("open 24/7", "open twenty-four seven"),
    ("It was 2026.", "It was two thousand twenty-six."),
    ("in 2026", "in twenty twenty-six"),
    ("since 1999", "since nineteen ninety-nine"),
    ("from 2020-2024", "from twenty twenty to twenty twenty-four"),
    # ordinals
    ("1st", "first"),
    ("22nd", "twenty-second"),
    ("3rd", "third"),
    ("11th", "eleventh"),
    ("101st", "one hundred first"),
    # percentages
    ("15%", "fifteen percent"),
    ("2.5%", "two point five percent"),
    ("100%", "one hundred percent"),
    ("10-15%", "ten to fifteen percent"),
    ("-3%", "minus three percent"),
    # dates
    ("2026-12-03", "December third, twenty twenty-six"),
    ("12/03/2026", "December third, twenty twenty-six"),
    ("25/12/2026", "December twenty-fifth, twenty twenty-six"),
    ("2026/12/03", "December third, twenty twenty-six"),
    ("Dec 3", "December third"),
    ("Dec. 3rd", "December third"),
    ("December 3, 2026", "December third, twenty twenty-six"),
    ("3 December 2026", "the third of December twenty twenty-six"),
    ("on the 3rd of December", "on the third of December"),
    ("March 2026", "March twenty twenty-six"),
    ("2005-01-31", "January thirty-first, two thousand five"),
    # times
    ("9:30", "nine thirty"),
    ("9:05", "nine oh five"),
    ("9:00", "nine o'clock"),
    ("9:30 am", "nine thirty AM"),
    ("9:30am", "nine thirty AM"),
    ("9:30 a.m.", "nine thirty AM."),
    ("8 a.m. to 8 p.m. Eastern Time", "eight AM to eight PM Eastern Time"),
    ("apples etc. Then", "apples et cetera. Then"),
    ("14:05", "two oh five PM"),
    ("14:00", "two PM"),
    ("0:30", "twelve thirty AM"),
    ("12:00", "twelve o'clock"),
    ("9am", "nine AM"),
    ("at 5 PM.", "at five PM."),
    ("9.30pm", "nine thirty PM"),
    ("Open 9am-5pm Mon-Fri", "Open nine AM to five PM Monday to Friday"),
    ("9:00-17:00", "nine o'clock to five PM"),
    # phone numbers, codes
    ("+1 (555) 123-4567", "plus one, five five five, one two three, four five six seven"),
    ("(555) 123-4567", "five five five, one two three, four five six seven"),
    ("555-123-4567", "five five five, one two three, four five six seven"),
    ("1-800-555-0100", "one, eight zero zero, five five five, zero one zero zero"),
    ("555-0100", "five five five, zero one zero zero"),
    ("+44 20 7946 0958", "plus four four, two zero, seven nine four six, zero nine five eight"),
    ("order number 12345678", "order number one two three four, five six seven eight"),
    ("account 0042", "account zero zero four two"),
    ("Your PIN is 1234.", "Your PIN is one two three four."),
    ("card ending in 9876", "card ending in nine eight seven six"),
    (
        "reference: 1234-5678-9012",
        "reference: one two three four, five six seven eight, nine zero one two",
    ),
    ("order #12345", "order number one two three, four five"),
    ("Call 911", "Call nine one one"),
    ("extension 204", "extension two zero four"),
    ("room 12", "room twelve"),
    ("12345", "one two three, four five"),
    ("1234567890", "one two three four, five six seven, eight nine zero"),
    ("007", "zero zero seven"),
    # units
    ("5 kg", "five kilograms"),
    ("1 kg", "one kilogram"),
    ("10 km", "ten kilometers"),
    ("3 GB", "three gigabytes"),
    ("500MB", "five hundred megabytes"),
    ("20 min", "twenty minutes"),
    ("2 h", "two hours"),
    ("2h", "two hours"),
    ("1.5 L", "one point five liters"),
    ("30°C", "thirty degrees Celsius"),
    ("-5 °C", "minus five degrees Celsius"),
    ("65 mph", "sixty-five miles per hour"),
    ("5-10 min", "five to ten minutes"),
    # abbreviations
    ("Mr. Smith", "Mister Smith"),
    ("Mrs. Jones", "Missus Jones"),
    ("Ms. Lee", "Miz Lee"),
    ("Mr Smith", "Mister Smith"),
    ("Dr. Smith", "Doctor Smith"),
    ("Elm Dr.", "Elm Drive."),
    ("St. Mary's", "Saint Mary's"),
    ("42nd St.", "forty-second Street."),
    ("123 Main St. today", "one hundred twenty-three Main Street today"),
    ("No. 5", "Number five"),
    ("no. 12345", "number one two three, four five"),
    ("approx. 20 min", "approximately twenty minutes"),
    ("e.g. this", "for example this"),
    ("i.e. that", "that is that"),
    ("apples, pears etc.", "apples, pears et cetera."),
    ("Apt 4B", "Apartment 4B"),
    ("5th Ave", "fifth Avenue"),
    ("business hrs", "business hours"),
    ("ext. 204", "extension two zero four"),
    # symbols
    ("press #", "press pound"),
    ("Press # to repeat.", "Press pound to repeat."),
    ("#5", "number five"),
    ("press *", "press star"),
    ("*72", "star seven two"),
    ("*#06#", "star pound zero six pound"),
    ("Tom & Jerry", "Tom and Jerry"),
    ("AT&T", "AT and T"),
    ("me@example.com", "me at example dot com"),
    ("visit acme.com", "visit acme dot com"),
    ("meet @ noon", "meet at noon"),
    # left alone
    ("word0 MP3 4G", "word0 MP3 4G"),
]

GB = [
    ("$120.50", "one hundred and twenty dollars and fifty cents"),
    ("1,120", "one thousand one hundred and twenty"),
    ("101st", "one hundred and first"),
    ("12/03/2026", "the twelfth of March twenty twenty-six"),
    ("on 12/03/2026", "on the twelfth of March twenty twenty-six"),
    ("2026-12-03", "the third of December twenty twenty-six"),
    ("press #", "press hash"),
    ("10 km", "ten kilometres"),
    ("2005", "two thousand and five"),
]

UNCHANGED = [
    "",
    "   ",
    "Hello, please hold.",
    "Thank you for calling Acme Bank. Your call is important to us!",
    "Please say yes or no.",
    "Press pound to repeat this menu.",
    "I am here; the main menu follows.",
    "Stay on the line, a doctor will answer.",
    "St",
    "May I help you?",
    "No, thank you.",
    "word0 MP3 4G",
    "你好，欢迎致电。",
]


@pytest.mark.parametrize(("text", "said"), US)
def test_american_english(text, said):
    assert spoken(text, "en-US") == said


@pytest.mark.parametrize(("text", "said"), GB)
def test_british_english(text, said):
    assert spoken(text, "en-GB") == said


def test_table_is_large_enough():
    assert len(US) + len(GB) >= 60


@pytest.mark.parametrize("text", UNCHANGED)
def test_text_without_anything_to_expand_is_unchanged(text):
    assert spoken(text, "en-US") == text
    assert spoken(text, "en-GB") == text


@pytest.mark.parametrize(("text", "said"), US + GB)
def test_idempotent_on_table(text, said):
    for language in ("en-US", "en-GB"):
        once = spoken(text, language)
        assert spoken(once, language) == once


@pytest.mark.parametrize(
    ("tag", "family"),
    [("en", "en"), ("en-US", "en"), ("EN_gb", "en"), ("en-us-f", "en"), ("en-AU", "en")],
)
def test_english_tags(tag, family):
    assert language_family(tag) == family


@pytest.mark.parametrize("tag", ["fr-FR", "es", "de", "", "x-plain", "--"])
def test_other_languages_pass_through(tag):
    text = "$120.50 on 2026-12-03 at 9:30, press # or *72"
    assert language_family(tag) == ""
    assert spoken(text, tag) == text


# Hypothesis: compositions of table inputs and pieces that tend to collide; arbitrary text.
_PIECES = [text for text, _ in US] + [
    "Dr",
    "St",
    "the",
    "in",
    "am",
    "-",
    ".",
    ",",
    ":",
    "#",
    "*",
    "$",
    "%",
    "@",
    "5",
    "12",
    "2026",
    "0",
    "Main",
]
compositions = st.lists(
    st.tuples(st.sampled_from(_PIECES), st.sampled_from(["", " ", ", ", ". "])), max_size=6
).map(lambda parts: "".join(piece + sep for piece, sep in parts))


@settings(max_examples=300, deadline=None)
@given(compositions, st.booleans())
def test_idempotent_on_compositions(text, british):
    rules = English(british=british)
    once = rules.spoken(text)
    assert rules.spoken(once) == once


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=60), st.booleans())
def test_never_raises_on_arbitrary_text(text, british):
    # English.spoken has no safety net (spoken() would hide a failure): it must not raise.
    rules = English(british=british)
    once = rules.spoken(text)
    assert rules.spoken(once) == once


@settings(max_examples=200, deadline=None)
@given(
    st.text(alphabet=st.sampled_from(list("0123456789 .,:-/+()#*$€£¥%&@°APMapmDrSt")), max_size=40)
)
def test_never_raises_on_digit_and_symbol_soup(text):
    for british in (False, True):
        rules = English(british=british)
        once = rules.spoken(text)
        assert rules.spoken(once) == once


@pytest.mark.parametrize(
    ("left", "right", "together"),
    [
        ("account", "00", True),  # "account 0042"
        ("Dr.", "Sm", True),  # "Dr. Smith"
        ("e.g.", "th", True),
        ("Dec", "3,", True),
        ("3,", "20", True),  # "Dec 3, 2026"
        ("5", "kg", True),
        ("9:30", "am", True),
        ("press", "#", True),
        ("the", "*", True),
        ("*", "ke", True),
        ("call", "+1", True),
        ("is", "$1", True),
        ("is", "-5", True),
        ("Tom", "&", True),
        ("number", "is", True),
        ("hello", "wo", False),
        ("is", "- ", False),
        ("calling", "th", False),
    ],
)
def test_glued_tokens(left, right, together):
    assert glued(left, right) is together


def test_an_ampersand_is_read_before_the_abbreviations_beside_it():
    # Found by test_idempotent_on_compositions: "Dr" after "AT&T" stayed in a first pass
    # and became "Drive" in a second.
    rules = English(british=False)
    assert rules.spoken("AT&T Dr") == "AT and T Drive"
    assert rules.spoken("AT and T Drive") == "AT and T Drive"
