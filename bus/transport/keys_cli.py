"""``bus-keys``: CURVE key pairs and the rights written in them (``mc0-keys`` is the same).

    bus-keys NAME DIR [rights]         write DIR/NAME.key (public) and DIR/NAME.key_secret
    bus-keys make NAME DIR [rights]    the same, for any NAME (even "make", "set" or "show")
    bus-keys set FILE.key [rights]     change the rights in a certificate (its key kept)
    bus-keys show FILE                 print a certificate's public key and rights
    bus-keys refuse KEY|FILE ...       refuse a client key now (through --http ports)

A first argument ``make``, ``set``, ``show`` or ``refuse`` is always the command: a key pair
named so is made with ``bus-keys make set DIR``.

Rights (the metadata of the certificate, see docs/security.md): ``--publish`` and
``--subscribe`` Event BUS subtrees, ``--role`` and ``--queues`` for eMQP, ``--names`` for the
DBP catalog, any other entry with ``--meta KEY=VALUE``; ``set`` also takes ``--unset KEY``, and
changes the other half of the pair too when it lies beside the file (same key).
Lists are comma-separated; an empty value (``--publish ""``) allows nothing, no entry allows
everything.

A public key made here never begins with a zero byte (zyre ignores the beacons of such a
node). The public key is printed on stdout, what was written on stderr; any error is one line
on stderr and exit status 1.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from bus.util.cliargs import CliParser, add_version, dashed_values, directory, interruptible

#: eMQP's ports a key may connect to: the broker's, then its PUBLISH service's.
ROLES = ("worker", "client", "admin", "publisher", "subscriber")
COMMANDS = ("make", "set", "show", "refuse")


class _Parser(CliParser):
    """A mistake is one line and exit status 1, like every other error here."""

    usage_status = 1


def _items(value: str, what: str) -> list[str]:
    """The comma-separated items of ``value``; none for an empty value (which allows nothing)."""
    if not value.strip():
        return []
    items = [item.strip() for item in value.split(",")]
    if not all(items):
        raise argparse.ArgumentTypeError(f"{value!r}: comma-separated {what}, none empty")
    return items


def _subtrees(value: str) -> str:
    items = _items(value, "subtrees")
    for item in items:
        if not item.startswith("/"):
            raise argparse.ArgumentTypeError(f"{item!r}: a subtree starts with / (/orders/)")
    return ",".join(items)


def _names(value: str) -> str:
    return ",".join(_items(value, "names"))


def _roles(value: str) -> str:
    items = _items(value, "roles")
    for item in items:
        if item not in ROLES:
            raise argparse.ArgumentTypeError(f"{item!r}: a role is one of {', '.join(ROLES)}")
    return ",".join(items)


#: The rights the services read, each checked as its option is.
RIGHTS: dict[str, Callable[[str], str]] = {
    "publish": _subtrees,
    "subscribe": _subtrees,
    "role": _roles,
    "queues": _names,
    "names": _names,
}


def _entry(value: str) -> tuple[str, str]:
    from bus.transport.certs import check_metadata

    key, sep, text = value.partition("=")
    key, text = key.strip(), text.strip()
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{value!r}: write KEY=VALUE")
    if key in RIGHTS:  # --meta role=boss is checked as --role boss is
        text = RIGHTS[key](text)
    try:
        check_metadata(key, text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return key, text


def _rights_arguments(parser: argparse.ArgumentParser) -> None:
    rights = parser.add_argument_group("rights (written in the certificate's metadata)")
    rights.add_argument("--publish", type=_subtrees, help="Event BUS subtrees it may publish in")
    rights.add_argument("--subscribe", type=_subtrees, help="Event BUS subtrees it receives")
    rights.add_argument(
        "--role",
        type=_roles,
        help="eMQP ports: worker, client, admin, publisher, subscriber (several)",
    )
    rights.add_argument("--queues", type=_names, help="eMQP queues it may serve or use")
    rights.add_argument("--names", type=_names, help="DBP service names it may register")
    rights.add_argument(
        "--meta", type=_entry, action="append", default=[], metavar="KEY=VALUE",
        help="any other metadata entry (repeat it)",
    )  # fmt: skip


def _metadata(args: argparse.Namespace) -> dict[str, str]:
    metadata = dict(args.meta)
    for name in RIGHTS:
        value = getattr(args, name)
        if value is not None:
            metadata[name] = value
    return metadata


def parser_for(command: str, prog: str = "bus-keys") -> argparse.ArgumentParser:
    """The parser of ``command`` (``make``, ``set`` or ``show``)."""
    if command == "set":
        parser = _Parser(
            prog=f"{prog} set", description="Change the rights in a certificate (its key kept)."
        )
        parser.add_argument("certificate", help="NAME.key (its NAME.key_secret beside it too)")
        _rights_arguments(parser)
        parser.add_argument(
            "--unset", action="append", default=[], metavar="KEY", help="drop an entry"
        )
        return parser
    if command == "refuse":
        import os

        from bus.util.cliargs import host_port, positive_seconds

        parser = _Parser(
            prog=f"{prog} refuse",
            description="Refuse a client key now on every CURVE port of a running process, "
            "through its HTTP port (POST /api/v1/actions/curve/refuse): its connections are "
            "cut, and its certificates moved out of the process's allow-list (into "
            "DIR/refused/). Give --http once per process (each host's). Prints one JSON "
            "line per process.",
            epilog="Exit status: 0 once every process refused it, 1 with one sentence per "
            "failure on stderr otherwise.",
        )
        parser.add_argument("key", help="the client's Z85 public key, or its certificate")
        parser.add_argument(
            "--http",
            action="append",
            type=host_port,
            help="host:port of a process's --http-port (repeat it; default "
            "$BUS_HTTP or 127.0.0.1:8642)",
        )
        parser.add_argument(
            "--token-file",
            default=os.environ.get("BUS_HTTP_TOKEN_FILE"),
            help="file of the bearer token their --http-token-file holds",
        )
        parser.add_argument("--timeout", type=positive_seconds, default=10.0)
        return parser
    if command == "show":
        parser = _Parser(
            prog=f"{prog} show",
            description="Print a certificate's public key and rights (never its secret key).",
        )
        parser.add_argument("certificate")
        return parser
    parser = _Parser(
        prog=prog,
        description="Make a CURVE key pair in the zcert format (CZMQ, zmq.auth): NAME.key "
        "(public: give it to a server's --client-certs, or to clients as --server-key) and "
        "NAME.key_secret (keep it private). Also: bus-keys make NAME DIR (any NAME), "
        "bus-keys set FILE.key, bus-keys show FILE.",
    )
    add_version(parser)
    parser.add_argument("name")
    parser.add_argument(
        "directory", type=directory, help="where to write them (made if its parent exists)"
    )
    _rights_arguments(parser)
    return parser


@interruptible("bus-keys")
def main(argv: Sequence[str] | None = None) -> None:
    """Run ``bus-keys`` on ``argv`` (default: the command line)."""
    run(argv, "bus-keys")


def run(argv: Sequence[str] | None, prog: str) -> None:
    """Run ``PROG`` (``bus-keys`` or ``mc0-keys``) on ``argv`` (default: the command line)."""
    from bus.transport.certs import (
        generate_key_pair,
        read_certificate,
        set_metadata,
        write_certificate,
    )
    from bus.transport.curve import KeyFileError

    arguments = _command_first(list(sys.argv[1:] if argv is None else argv))
    command = arguments[0] if arguments and arguments[0] in COMMANDS else ""
    parser = parser_for(command or "make", prog)
    rest = dashed_values(parser, arguments[1:] if command else arguments)
    if command == "refuse":
        rest = _key_last(parser, rest)
    args = parser.parse_args(rest)
    if command == "refuse":
        raise SystemExit(_refuse(args, prog))
    try:
        if command == "show":
            certificate = read_certificate(args.certificate)
            _out(certificate.public.decode("ascii"))
            for key, value in certificate.metadata.items():
                _out(f"{key} = {value}")
        elif command == "set":
            path = Path(args.certificate)
            public = read_certificate(path).public
            # Its other half beside it is changed too: CZMQ's zcert_load reads NAME.key_secret
            # in place of NAME.key when both are there, so they must not disagree.
            sibling = _other_half(path)
            if sibling.exists() and read_certificate(sibling).public == public:
                set_metadata(sibling, _metadata(args), args.unset)
                _err(f"rewrote {sibling}")
            changed = set_metadata(path, _metadata(args), args.unset)
            _err(f"rewrote {path}")
            for key, value in changed.metadata.items():
                _err(f"    {key} = {value}")
        else:
            public, secret = generate_key_pair()
            existed = args.directory.is_dir()
            public_path, secret_path = write_certificate(
                args.directory, args.name, public, secret, _metadata(args)
            )
            made = "" if existed else f"made {args.directory}, "
            _err(f"{made}wrote {public_path} and {secret_path}")
            _out(public.decode("ascii"))
    except (KeyFileError, ValueError, OSError) as error:
        _err(f"{prog}: {error}")
        raise SystemExit(1) from None


def _refuse(args: argparse.Namespace, prog: str) -> int:
    """``refuse``: the key sent to each process named; 0 when each refused it."""
    import json
    import os

    from bus.transport.certs import KeyFileError, check_key, read_certificate
    from bus.util.httpaction import ActionFailed, act, read_token

    try:
        try:
            key = check_key(args.key).decode("ascii")
        except KeyFileError:
            key = read_certificate(args.key).public.decode("ascii")
        token = read_token(args.token_file)
    except (KeyFileError, OSError, ActionFailed) as error:
        _err(f"{prog} refuse: {error}")
        return 1
    failed = 0
    for address in args.http or [os.environ.get("BUS_HTTP", "127.0.0.1:8642")]:
        try:
            result = act(address, "curve", "refuse", {"key": key}, token, args.timeout)
        except ActionFailed as error:
            _err(f"{prog} refuse: {error}")
            failed += 1
            continue
        _out(json.dumps({"http": address, **result}, sort_keys=True))
    return 1 if failed else 0


def _command_first(arguments: list[str]) -> list[str]:
    """``arguments`` with the command (``make``, ``set``, ``show``) first when options come
    before it (``bus-keys --role admin set alice.key``): the first argument that is neither an
    option nor an option's value is the command, if it names one."""
    takes_value = {
        option
        for action in parser_for("set")._actions
        if action.nargs != 0
        for option in action.option_strings
    }
    index = 0
    while index < len(arguments) and arguments[index].startswith("-") and arguments[index] != "--":
        option = arguments[index]
        index += 2 if option in takes_value else 1
    if 0 < index < len(arguments) and arguments[index] in COMMANDS:
        return [arguments[index], *arguments[:index], *arguments[index + 1 :]]
    return arguments


def _key_last(parser: argparse.ArgumentParser, arguments: list[str]) -> list[str]:
    """``refuse``'s arguments with a key that begins with a dash (one Z85 key in 85 does)
    moved after ``--``, where argparse takes it for the positional it is and not for an
    option. ``refuse`` has that one positional, so its place among options is free."""
    from bus.transport.certs import check_key
    from bus.transport.curve import KeyFileError

    if "--" in arguments:
        return arguments
    for index, arg in enumerate(arguments):
        if not arg.startswith("-") or arg.partition("=")[0] in parser._option_string_actions:
            continue
        try:
            check_key(arg)
        except (KeyFileError, ValueError):
            continue
        return [*arguments[:index], *arguments[index + 1 :], "--", arg]
    return arguments


def _other_half(path: Path) -> Path:
    """``NAME.key_secret`` for ``NAME.key`` and the other way round."""
    if path.name.endswith("_secret"):
        return path.with_name(path.name.removesuffix("_secret"))
    return path.with_name(path.name + "_secret")


@interruptible("mc0-keys")
def mc0_keys_main(argv: Sequence[str] | None = None) -> None:
    """``mc0-keys NAME DIR``: the former name of ``bus-keys``."""
    run(argv, "mc0-keys")


def _out(line: str) -> None:
    sys.stdout.write(line + "\n")


def _err(line: str) -> None:
    sys.stderr.write(line + "\n")


if __name__ == "__main__":
    main()
