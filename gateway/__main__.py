"""``python -m gateway``: run the gateway, or mint a token.

python -m gateway serve [--dev]
python -m gateway token --sub NAME [--tenant T] [--ttl S] [--scope S ...]

With ``GATEWAY_WORKERS=N`` (N > 1), ``serve`` runs the host supervisor
(:mod:`gateway.workers`), which starts N ``python -m gateway worker`` processes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import secrets
import signal
import sys
from collections.abc import Callable

from aiohttp import web

from engine.ipc.heap import freeze_startup_heap
from engine.ipc.lifetime import die_with_parent, watch_parent
from engine.speech_cache.cache import prepare_speech_cache
from gateway import logs
from gateway.app import LEG_SERVICES_KEY, RedactingAccessLogger, create_app
from gateway.auth import AuthConfigError, TokenVerifier, mint_token
from gateway.config import ConfigError, GatewaySettings
from gateway.legs.kinds import check_leg_settings
from gateway.listener import ConnectionGuard, GuardedSite
from gateway.relay_endpoint import RelayEndpoint
from gateway.state import STATE_KEY
from gateway.workers import HostSupervisor, mark_listening, supervise_until_signalled

log = logging.getLogger("gateway")
DEV_TOKEN_TTL_S = 12 * 3600


def _token(args: argparse.Namespace) -> int:
    secret = os.environ.get("GATEWAY_JWT_SECRET")
    key_path = os.environ.get("GATEWAY_JWT_PRIVATE_KEY")
    if not secret and not key_path:
        print(
            "set GATEWAY_JWT_SECRET (HS256), or GATEWAY_JWT_PRIVATE_KEY with --alg "
            "RS256/ES256, to sign a token",
            file=sys.stderr,
        )
        return 2
    private_key = None
    if key_path:
        with open(key_path, "rb") as f:
            private_key = f.read()
    try:
        token = mint_token(
            secret=None if private_key else secret,
            private_key_pem=private_key,
            algorithm=args.alg if private_key else "HS256",
            subject=args.sub,
            tenant=args.tenant,
            ttl_s=args.ttl,
            scopes=args.scope or ["tts:stream"],
            audience=os.environ.get("GATEWAY_JWT_AUDIENCE") or None,
            issuer=os.environ.get("GATEWAY_JWT_ISSUER") or None,
            max_streams=args.max_streams,
            kid=args.kid,
        )
    except ValueError as exc:
        print(f"cannot sign: {exc}", file=sys.stderr)
        return 2
    print(token)
    return 0


def _serve(args: argparse.Namespace) -> int:
    logs.configure(
        os.environ.get("LOG_LEVEL", "INFO"),
        "%(asctime)s gateway[%(process)d] %(levelname)s %(name)s: %(message)s",
    )
    env = dict(os.environ)
    dev_token = None
    if args.dev and not env.get("GATEWAY_JWT_SECRET") and not env.get("GATEWAY_JWT_PUBLIC_KEY"):
        env["GATEWAY_JWT_SECRET"] = secrets.token_urlsafe(48)
        os.environ["GATEWAY_JWT_SECRET"] = env["GATEWAY_JWT_SECRET"]
        log.warning("dev mode: generated a random GATEWAY_JWT_SECRET for this run only")
    worker = args.command == "worker"
    try:
        settings = GatewaySettings.from_env(env)
        check_leg_settings(env)
        if not worker and not settings.engine_socket:
            prepare_speech_cache(env)  # its engine's: a squatted directory stops us here
        hosting = settings.workers > 1 and not worker
        relay = None if hosting else RelayEndpoint.bind(settings, env)
        app = None if hosting else create_app(settings, relay=relay)
        if hosting:
            TokenVerifier.from_settings(settings.auth)  # a bad key fails here, not per worker
    except (ConfigError, AuthConfigError, OSError) as exc:
        print(f"configuration error: {exc}", file=sys.stderr)
        return 2
    if args.dev and env.get("GATEWAY_JWT_SECRET"):
        dev_token = mint_token(
            secret=env["GATEWAY_JWT_SECRET"],
            subject="dev",
            tenant="dev",
            ttl_s=DEV_TOKEN_TTL_S,
            scopes=["tts:stream", "voices:write"],
            audience=settings.auth.audience,
            issuer=settings.auth.issuer,
        )
    with contextlib.suppress(ImportError):
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())

    def announce(_app: web.Application | None) -> None:
        base = f"http://{settings.host}:{settings.port}"
        workers = f" ({settings.workers} workers)" if _app is None else ""
        if dev_token:
            print(
                f"\n  Voice gateway is up{workers}.\n"
                f"  Demo page : {base}/#token={dev_token}\n"
                f"  Token     : {dev_token}\n"
                f"  Stream    : ws://{settings.host}:{settings.port}/v1/stream "
                f"(Authorization: Bearer <token>)\n",
                flush=True,
            )
        else:
            print(f"Voice gateway listening on {base}{workers}", flush=True)
        if _app is None:
            return
        for service in _app[LEG_SERVICES_KEY]:
            print(f"  {service.describe()}", flush=True)

    if app is None:
        supervisor = HostSupervisor(settings, env)
        asyncio.run(supervise_until_signalled(supervisor, lambda: announce(None)))
        return 0
    if worker:
        die_with_parent(args.parent_pid)
        asyncio.run(
            _serve_until_signalled(
                app, settings, lambda: mark_listening(env), relay=relay, parent_pid=args.parent_pid
            )
        )
        return 0
    asyncio.run(_serve_until_signalled(app, settings, lambda: announce(app), relay=relay))
    return 0


async def _serve_until_signalled(
    app: web.Application,
    settings: GatewaySettings,
    listening: Callable[[], None],
    *,
    relay: RelayEndpoint | None = None,
    parent_pid: int | None = None,
) -> None:
    """Serve until SIGTERM or SIGINT (or, for a host's worker, until the supervisor with
    ``parent_pid`` is gone), then shut down gracefully.

    Order: stop listening (new connections go to other instances), drain (sessions in
    progress keep running, both directions, for up to ``GATEWAY_DRAIN_TIMEOUT_S``; those
    still open then get ``shutting_down`` and close 1013), then aiohttp's own shutdown.
    The drain cannot be an ``on_shutdown`` hook: by then aiohttp ignores inbound data on
    every connection, so a caller's barge-in or an application's ``close`` would be lost.
    """

    def runner_for(served: web.Application) -> web.AppRunner:
        return web.AppRunner(
            served,
            handle_signals=False,
            access_log_class=RedactingAccessLogger,
            shutdown_timeout=5.0,
            # aiohttp's keep-alive timer runs from connect: a request head must arrive in time
            keepalive_timeout=settings.handshake_timeout_s,
        )

    state = app[STATE_KEY]
    runner = runner_for(app)
    await runner.setup()
    # The relay listener: the relay route only, its own runner, the same guards.
    relay_runner = None if relay is None else runner_for(relay.app(state))
    if relay_runner is not None:
        await relay_runner.setup()
    guard = ConnectionGuard(
        max_connections=settings.max_connections,
        send_stall_s=settings.send_stall_s,
        metrics=state.metrics,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    watcher = None if parent_pid is None else asyncio.create_task(watch_parent(parent_pid, stop))
    try:
        guard.guard(runner)
        site = GuardedSite(
            runner,
            guard,
            host=settings.host,
            port=settings.port,
            reuse_port=parent_pid is not None,  # the host's workers share the port
        )
        await site.start()
        if relay is not None and relay_runner is not None:
            guard.guard(relay_runner)
            await GuardedSite(relay_runner, guard, sock=relay.sock).start()
        guard.start()
        freeze_startup_heap("the gateway's start-up")
        listening()
        await stop.wait()
        log.info("shutting down: no new connections (a second signal skips the drain)")
        await site.stop()
        drain = asyncio.create_task(state.connections.drain(settings.drain_timeout_s))
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, drain.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await drain
    finally:
        if watcher is not None:  # the supervisor's watch ends with the serving, however
            watcher.cancel()
        await guard.stop()
        if relay_runner is not None:  # relayed sessions end before the worker's state
            await relay_runner.cleanup()
        await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gateway", description=__doc__)
    sub = parser.add_subparsers(dest="command")
    serve = sub.add_parser("serve", help="run the gateway (default)")
    serve.add_argument(
        "--dev", action="store_true", help="generate a secret if none is set; print a token"
    )
    worker = sub.add_parser("worker", help="one of GATEWAY_WORKERS (the supervisor runs it)")
    worker.add_argument("--parent-pid", type=int, required=True, help="the host supervisor")
    token = sub.add_parser("token", help="print a signed token")
    token.add_argument("--sub", required=True, help="subject (who the token is for)")
    token.add_argument("--tenant", default=None)
    token.add_argument("--ttl", type=int, default=3600, help="lifetime in seconds")
    token.add_argument("--scope", action="append", help="scope (repeatable); tts:stream default")
    token.add_argument("--max-streams", type=int, default=None)
    token.add_argument("--alg", default="RS256", help="algorithm with GATEWAY_JWT_PRIVATE_KEY")
    token.add_argument("--kid", default=None)
    args = parser.parse_args(argv)
    if args.command == "token":
        return _token(args)
    if args.command in (None, "worker"):
        args.dev = False
    return _serve(args)


if __name__ == "__main__":
    sys.exit(main())
