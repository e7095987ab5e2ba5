"""queue-cli: send one request to a queue-server cluster and print the reply: readable lines by
default, the reply's JSON (one line per reply) with --json, for scripts. `queue-cli top` shows
per-queue rates live (client/top.py).

Exit status: 0 ok (reply on stdout), 1 the server answered with an error (on stderr: one line,
or the error reply's JSON with --json), 2 no server could be reached or a usage error.
"""
from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import orjson

from queue_server.version import add_version_option

from . import admin, top
from .credentials import load_token
from . import protocol as p
from . import tls
from .errors import NoServerAvailable, QueueError, QueueTimeout
from .sync import QueueClient

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_UNREACHABLE = 2
EXIT_USAGE = 2


def _hosts(text: str) -> list[p.Address]:
    try:
        return p.parse_hosts(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _number(text: str) -> int | float:
    """An int when the text is one (what the original's clients send), else a finite float."""
    value = p.number(text)
    if value is None:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}")
    return value


def _positive(text: str) -> float:
    value = float(_number(text))
    if value <= 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return value


def _common_options(parser: argparse.ArgumentParser, defaults: bool) -> None:
    """--hosts/--udp/--timeout; subcommands repeat them without defaults so either place works."""

    def default(value: Any) -> Any:
        return value if defaults else argparse.SUPPRESS

    parser.add_argument(
        "--hosts", type=_hosts, default=default(p.parse_hosts("127.0.0.1:1111")), metavar="H:P,...",
        help="servers to try in turn (default 127.0.0.1:1111)",
    )
    parser.add_argument(
        "--udp", action="store_true", default=default(False), help="send the request over UDP"
    )
    parser.add_argument(
        "--token-file", default=default(None), metavar="FILE",
        help="file holding the client token (auth_token_file on the nodes); default: $QUEUE_TOKEN",
    )
    parser.add_argument(
        "--tls", action="store_true", default=default(False),
        help="connect with TLS (nodes with tls_cert_file); the nodes' certificates are verified",
    )
    parser.add_argument(
        "--tls-ca", default=default(None), metavar="FILE",
        help="CA certificates (PEM) to verify the nodes with, instead of the system's; implies --tls",
    )
    parser.add_argument(
        "--tls-cert", default=default(None), metavar="FILE",
        help="this client's certificate (PEM; nodes with tls_ca_file require one); implies --tls",
    )
    parser.add_argument(
        "--tls-key", default=default(None), metavar="FILE",
        help="the private key of --tls-cert (if not in that file)",
    )
    parser.add_argument(
        "--timeout", type=_positive, default=default(5.0), metavar="S",
        help="seconds to wait for a reply (default 5; a consume's --wait is added)",
    )
    parser.add_argument(
        "--json", action="store_true", default=default(False),
        help="print each reply as one line of JSON, and errors as their JSON on stderr (for scripts)",
    )


def _ids(values: list[int]) -> int | list[int] | None:
    if not values:
        return None
    return values[0] if len(values) == 1 else values


def _batches(a: argparse.Namespace) -> list[list[str]]:
    """The produce's message bodies, in batches: `-` stands for standard input (one message, its
    last newline dropped; with --lines, one message per non-empty line)."""
    if "-" not in a.data:
        if a.lines:
            raise SystemExit("queue-cli: --lines reads standard input: give - as DATA")
        return [a.data]
    if a.data != ["-"]:
        raise SystemExit("queue-cli: - (standard input) must be the only DATA")
    text = sys.stdin.read()
    if not a.lines:
        return [[text[:-1] if text.endswith("\n") else text]]
    lines = [line for line in text.splitlines() if line]
    if not lines:
        raise SystemExit("queue-cli: --lines: standard input holds no line")
    return [lines[i:i + p.MAX_BATCH] for i in range(0, len(lines), p.MAX_BATCH)]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of queue-cli."""
    parser = argparse.ArgumentParser(prog="queue-cli", description="Send one request to queue-server.")
    add_version_option(parser)
    _common_options(parser, defaults=True)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        cmd = sub.add_parser(name, help=help_text, description=help_text)
        _common_options(cmd, defaults=False)
        return cmd

    cmd = command("produce", "store messages (several DATA: one batch, all or none; - reads standard input)")
    cmd.add_argument("queue", metavar="QUEUE")
    cmd.add_argument("data", nargs="+", metavar="DATA")
    cmd.add_argument("--lines", action="store_true",
                     help="with -: one message per line of standard input (one batch per 1000 lines)")
    cmd.add_argument("--delay", type=_number, metavar="T", help="ready time: unix time, or seconds from now")
    cmd.add_argument("--ttl", type=_number, metavar="T", help="expiry: unix time, or seconds from now")
    cmd.add_argument("--retry", type=_number, metavar="S", help="lease seconds (0: at most once)")
    cmd.add_argument("--priority", type=int, metavar="N", help="higher first (default 0)")
    cmd.add_argument("--producer", metavar="ID", help="idempotent produce: producer id (with --sequence)")
    cmd.add_argument("--sequence", type=int, metavar="N", help="idempotent produce: sequence number")
    cmd.add_argument("--max-deliveries", type=int, metavar="N", help="dead letter after N unconfirmed deliveries (0: never)")
    cmd.set_defaults(build=lambda a: [p.produce_request(
        a.queue, data[0] if len(data) == 1 else data, a.delay, a.ttl, a.retry, a.priority,
        a.producer, a.sequence, a.max_deliveries) for data in _batches(a)])

    cmd = command("consume", "take ready messages")
    cmd.add_argument("queue", metavar="QUEUE")
    cmd.add_argument("--count", type=int, metavar="N", help="take up to N messages (1..1000) as a batch")
    cmd.add_argument("--wait", type=_number, metavar="S", help="long poll: wait up to S seconds for a message")
    cmd.add_argument("--lease", type=_number, metavar="S", help="lease what is delivered for S seconds")
    cmd.add_argument("--token", metavar="T", help="bind the lease to token T (a retry returns the same)")
    cmd.add_argument("--times", action="store_true", help="add ready, ttl and lease_until")
    cmd.set_defaults(build=lambda a: p.consume_request(a.queue, a.count, a.wait, a.lease, a.token, a.times))

    def by_token(cmd: argparse.ArgumentParser) -> None:
        cmd.add_argument("msg_ids", nargs="*", type=int, metavar="MSG_ID")
        cmd.add_argument("--token", metavar="T", help="messages leased under token T")
        cmd.add_argument("--token-prefix", metavar="P", help="messages leased under tokens starting with P")

    def selection(a: argparse.Namespace) -> dict[str, Any]:
        return {"token": a.token, "token_prefix": a.token_prefix}

    for name, action, help_text in (
        ("confirm", p.CONFIRM, "delete consumed messages"),
        ("release", p.RELEASE, "give leases back (messages ready again at once)"),
    ):
        cmd = command(name, help_text)
        cmd.add_argument("queue", metavar="QUEUE")
        by_token(cmd)
        cmd.set_defaults(build=lambda a, action=action: p.ids_request(
            action, a.queue, _ids(a.msg_ids), **selection(a)))

    cmd = command("extend", "make leases end S seconds from now")
    cmd.add_argument("queue", metavar="QUEUE")
    by_token(cmd)
    cmd.add_argument("--retry", type=_number, required=True, metavar="S")
    cmd.set_defaults(build=lambda a: p.ids_request(
        p.EXTEND, a.queue, _ids(a.msg_ids), retry=a.retry, **selection(a)))

    cmd = command("monitor", "statistics of a queue, or of the node")
    cmd.add_argument("queue", nargs="?", metavar="QUEUE")
    cmd.add_argument("--local", action="store_true", help="ask the node itself, not the leader")
    cmd.set_defaults(build=lambda a: p.monitor_request(a.queue, a.local))

    cmd = command("list", "names of queues containing PATTERN")
    cmd.add_argument("pattern", nargs="?", default="", metavar="PATTERN")
    cmd.add_argument("--local", action="store_true", help="ask the node itself, not the leader")
    cmd.set_defaults(build=lambda a: p.list_request(a.pattern, a.local))

    cmd = command("leader", "the leader's node id and address")
    cmd.set_defaults(build=lambda a: p.leader_request())

    cmd = command("top", "per-queue rates, refreshed live (like top)")
    cmd.add_argument("pattern", nargs="?", default="", metavar="PATTERN", help="only queues containing PATTERN")
    cmd.add_argument("--interval", type=_positive, default=2.0, metavar="S", help="seconds between refreshes (default 2)")
    cmd.add_argument("--once", action="store_true", help="measure one interval, print the table once and exit")
    cmd.add_argument("--limit", type=int, default=top.DEFAULT_LIMIT, metavar="N",
                     help=f"show the N busiest queues (default {top.DEFAULT_LIMIT})")
    cmd.set_defaults(build=None)
    admin.add_commands(command, lambda parser: _common_options(parser, defaults=False))
    return parser


def _dump(obj: Any) -> str:
    return orjson.dumps(obj).decode()


def human(request: dict, reply: dict) -> str:
    """A reply as lines a person reads: the fields the request did not send (no echo, no code),
    `key: value` each; messages one per line; queue names one per line."""
    lines = []
    for key, value in reply.items():
        if key in request or key in ("code", "seq"):
            continue
        if key == "messages" and isinstance(value, list):
            lines.append(f"messages: {len(value)}")
            lines.extend("  " + "  ".join(f"{k}={_scalar(v)}" for k, v in m.items()) for m in value
                         if isinstance(m, dict))
        elif key == "queue_list" and isinstance(value, list):
            lines.extend(str(name) for name in value)
        else:
            lines.append(f"{key}: {_scalar(value)}")
    return "\n".join(lines) if lines else "ok"


def _scalar(value: Any) -> str:
    return value if isinstance(value, str) else _dump(value)


def _print_reply(request: dict, reply: dict, as_json: bool) -> None:
    print(_dump(reply) if as_json else human(request, reply))


def _print_error(exc: QueueError, as_json: bool, udp_without_token: bool = False) -> None:
    if as_json:
        print(_dump(exc.reply), file=sys.stderr)
    else:
        print(f"queue-cli: {exc.reason}{_hint(exc, udp_without_token)}", file=sys.stderr)


def _hint(exc: QueueError, udp_without_token: bool) -> str:
    """What a person can do about the error, in parentheses; "" when its reason says it."""
    if udp_without_token and isinstance(exc, QueueTimeout):
        # a node with auth_token_file drops such datagrams unanswered (no amplification)
        return " (over UDP, a node that requires a token does not answer without one: --token-file FILE, or $QUEUE_TOKEN)"
    if exc.reason.startswith(p.AUTH_REFUSED):
        return " (queue-cli gives the nodes' token from --token-file FILE, or $QUEUE_TOKEN)"
    if exc.reason == p.NO_LEADER:
        return (" (the nodes reached know no leader: fewer than a majority of the cluster are up and in touch, "
                "or an election is on; give --hosts every node)")
    return ""


def main(argv: Sequence[str] | None = None) -> int:
    """Run queue-cli with `argv` (default sys.argv[1:]); the exit status."""
    try:
        return _main(argv)
    except BrokenPipeError:
        # The reader went away (`queue-cli ... | head`): not an error worth a traceback. Point
        # stdout at /dev/null so that the interpreter's final flush does not complain either.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # usage error (2) or --help (0)
        return exc.code if isinstance(exc.code, int) else EXIT_OK
    if args.build is None:
        return _top(args)
    try:
        built = args.build(args)
    except SystemExit as exc:  # bad input found while building (stdin), as one line
        print(exc.code, file=sys.stderr)
        return EXIT_USAGE
    requests = built if isinstance(built, list) else [built]

    def send(client: QueueClient) -> None:
        for req in requests:
            _print_reply(req, client.request(req), args.json)
    return _with_client(args, send)


def _with_client(args: argparse.Namespace, work: Callable[[QueueClient], None]) -> int:
    """Run work(client) with a client made from the options; the exit status, errors printed."""
    try:
        token = load_token(args.token_file)
    except OSError as exc:
        print(f"queue-cli: --token-file: cannot read {args.token_file}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        ssl_context = tls.TlsFiles(args.tls, args.tls_ca, args.tls_cert, args.tls_key).context()
    except tls.TlsFileError as exc:
        why = exc.reason if exc.what is None else f"not {exc.what} ({exc.reason})"
        print(f"queue-cli: --tls-ca/--tls-cert/--tls-key: cannot load {exc.path}: {why}", file=sys.stderr)
        return EXIT_USAGE
    try:
        with QueueClient(args.hosts, transport="udp" if args.udp else "tcp", timeout=args.timeout,
                         token=token, tls=ssl_context) as client:
            work(client)
    except (NoServerAvailable, QueueTimeout) as exc:
        _print_error(exc, args.json, udp_without_token=args.udp and token is None)
        return EXIT_UNREACHABLE
    except QueueError as exc:
        _print_error(exc, args.json)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130
    return EXIT_OK


def _top(args: argparse.Namespace) -> int:
    """queue-cli top: the table live until ^C, or once (--once; with --json: the rows as JSON)."""
    def show(client: QueueClient) -> None:
        sampler = top.Sampler(client, args.pattern)
        if args.json:
            rows = sampler.measure(args.interval, args.limit)
            print(_dump({"node": sampler.node, "queues": [row._asdict() for row in rows]}))
        elif args.once:
            top.print_once(sampler, sampler.measure(args.interval, args.limit))
        else:
            try:
                top.live(sampler, args.interval, args.limit)
            except KeyboardInterrupt:
                pass  # ^C is how top ends
    return _with_client(args, show)


if __name__ == "__main__":
    sys.exit(main())
