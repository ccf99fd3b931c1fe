// Example IVR prompts for the demo page. `voices`: the built-in voices the page picks from
// (the first the engine has) when the selected voice does not speak the prompt's language:
// the neural ones first (Kokoro's zh-xiaoyi, the Mandarin voice with the lowest measured
// character error rate through mu-law, docs/benchmarks.md; Kokoro's and Piper's English),
// espeak's after them. `lang` is matched against the first subtag of a voice's `language`
// (plus the region for Cantonese, zh-HK).

export const PROMPTS = [
  {
    lang: "en",
    voices: ["en-us-heart", "en-us-joe", "en-us"],
    label: "Main menu",
    text:
      "Thank you for calling Acme Bank. For account balances, press 1. " +
      "To report a lost or stolen card, press 2. To speak with an agent, press 0.",
  },
  {
    lang: "en",
    voices: ["en-us-bella", "en-us-f"],
    label: "Hold message",
    text:
      "All of our agents are currently busy. Your call is important to us. " +
      "The expected wait time is about 4 minutes.",
  },
  {
    lang: "en",
    voices: ["en-gb-emma", "en-gb"],
    label: "Card number",
    text: "Please enter your 16-digit card number, followed by the hash key.",
  },
  {
    lang: "zh",
    voices: ["zh-xiaoyi", "zh"],
    label: "主菜单",
    text: "您好，欢迎致电客户服务中心。查询账户余额请按1，挂失银行卡请按2，人工服务请按0。",
  },
  {
    lang: "zh",
    voices: ["zh-yunxi", "zh-f"],
    label: "等候提示",
    text: "您的来电对我们非常重要，所有座席正忙，预计等候时间约为四分钟，请耐心等待。",
  },
  {
    lang: "zh",
    voices: ["zh-xiaoyi", "zh"],
    label: "输入卡号",
    text: "请输入您的十六位银行卡号，并以井号键结束。",
  },
  {
    lang: "zh",
    voices: ["zh-xiaoyi", "zh"],
    label: "订单查询",
    text: "您的订单A12345已发货，预计12月8日送达，运费15.50元。如有疑问请拨打400-820-8820。",
  },
  {
    lang: "zh",
    voices: ["zh-yunjian", "zh"],
    label: "中英混合",
    text: "欢迎使用 WeChat Pay，您本次支付成功，感谢您的使用。",
  },
  {
    lang: "en",
    voices: ["en-us-michael", "en-us-joe", "en-us"],
    label: "Order status",
    text:
      "Your order A12345 shipped on December 3rd and will arrive by Monday. " +
      "The total was $42.50.",
  },
  {
    lang: "zh-HK",
    voices: ["yue"],
    label: "粵語 歡迎",
    text: "多謝你致電客戶服務熱線。查詢戶口結餘請按1，轉駁客戶服務主任請按0。",
  },
];

/** Whether a voice's BCP 47 `language` (e.g. "zh-CN") suits a prompt's `lang`. */
export function voiceSpeaks(voiceLanguage, lang) {
  const voice = String(voiceLanguage || "").toLowerCase();
  const want = lang.toLowerCase();
  if (want.includes("-")) return voice === want;
  // Mandarin prompts: any zh voice but Cantonese (zh-HK).
  if (want === "zh") return voice.startsWith("zh") && voice !== "zh-hk";
  return voice.split("-")[0] === want;
}
