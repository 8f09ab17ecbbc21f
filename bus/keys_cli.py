"""``bus-keys``: CURVE key pairs and the rights written in them (``mc0-keys`` is the same).

    bus-keys NAME DIR [rights]         write DIR/NAME.key (public) and DIR/NAME.key_secret
    bus-keys set FILE.key [rights]     change the rights in a certificate (its key kept)
    bus-keys show FILE                 print a certificate's public key and rights

Rights (the metadata of the certificate, see docs/security.md): ``--publish`` and
``--subscribe`` Event BUS subtrees, ``--role`` and ``--queues`` for eMQP, ``--names`` for the
DBP catalog, any other entry with ``--meta KEY=VALUE``; ``set`` also takes ``--unset KEY``.
(``set`` and ``show`` are commands, not names of key pairs.)
An empty value (``--publish ""``) allows nothing; no entry allows everything.

A public key made here never begins with a zero byte (zyre ignores the beacons of such a
node); the public key is printed on stdout, what was written on stderr.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

ROLES = ("worker", "client", "admin")
_COMMANDS = ("set", "show")


def _subtrees(value: str) -> str:
    parts = [part.strip() for part in value.split(",") if part.strip()]
    for part in parts:
        if not part.startswith("/"):
            raise argparse.ArgumentTypeError(f"{part!r}: a subtree starts with / (/orders/)")
    return ",".join(parts)


def _names(value: str) -> str:
    parts = [part.strip() for part in value.split(",")]
    if value.strip() and not all(parts):
        raise argparse.ArgumentTypeError(f"{value!r}: comma-separated names, none empty")
    return ",".join(part for part in parts if part)


def _roles(value: str) -> str:
    parts = [part.strip() for part in value.split(",") if part.strip()]
    for part in parts:
        if part not in ROLES:
            raise argparse.ArgumentTypeError(f"{part!r}: a role is one of {', '.join(ROLES)}")
    return ",".join(parts)


def _entry(value: str) -> tuple[str, str]:
    key, sep, text = value.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"{value!r}: write KEY=VALUE")
    return key.strip(), text.strip()


def _rights_arguments(parser: argparse.ArgumentParser) -> None:
    rights = parser.add_argument_group("rights (written in the certificate's metadata)")
    rights.add_argument("--publish", type=_subtrees, help="Event BUS subtrees it may publish in")
    rights.add_argument("--subscribe", type=_subtrees, help="Event BUS subtrees it receives")
    rights.add_argument("--role", type=_roles, help="eMQP ports: worker, client, admin (several)")
    rights.add_argument("--queues", type=_names, help="eMQP queues it may serve or use")
    rights.add_argument("--names", type=_names, help="DBP service names it may register")
    rights.add_argument(
        "--meta", type=_entry, action="append", default=[], metavar="KEY=VALUE",
        help="any other metadata entry (repeat it)",
    )  # fmt: skip


def _metadata(args: argparse.Namespace) -> dict[str, str]:
    metadata = dict(args.meta)
    for name in ("publish", "subscribe", "role", "queues", "names"):
        value = getattr(args, name)
        if value is not None:
            metadata[name] = value
    return metadata


def parser_for(command: str) -> argparse.ArgumentParser:
    prog = "bus-keys"
    if command == "set":
        parser = argparse.ArgumentParser(
            prog=f"{prog} set", description="Change the rights in a certificate (its key kept)."
        )
        parser.add_argument("certificate", help="NAME.key (or NAME.key_secret)")
        _rights_arguments(parser)
        parser.add_argument("--unset", action="append", default=[], metavar="KEY")
        return parser
    if command == "show":
        parser = argparse.ArgumentParser(
            prog=f"{prog} show", description="Print a certificate's public key and rights."
        )
        parser.add_argument("certificate")
        return parser
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Make a CURVE key pair in the zcert format (CZMQ, zmq.auth): NAME.key "
        "(public: give it to a server's --client-certs, or to clients as --server-key) and "
        "NAME.key_secret (keep it private). Also: bus-keys set FILE.key, bus-keys show FILE.",
    )
    parser.add_argument("name")
    parser.add_argument("directory")
    _rights_arguments(parser)
    return parser


def main(argv: Sequence[str] | None = None, prog: str = "bus-keys") -> None:
    from bus.transport.certs import read_certificate, set_metadata
    from bus.transport.curve import KeyFileError, create_key_pair

    arguments = list(sys.argv[1:] if argv is None else argv)
    # "set" and "show" are commands, never the NAME of a key pair.
    command = arguments[0] if arguments and arguments[0] in _COMMANDS else "make"
    args = parser_for(command).parse_args(arguments[1:] if command != "make" else arguments)
    try:
        if command == "show":
            certificate = read_certificate(args.certificate)
            _out(certificate.public.decode("ascii"))
            for key, value in certificate.metadata.items():
                _out(f"{key} = {value}")
            return
        if command == "set":
            changed = set_metadata(args.certificate, _metadata(args), args.unset)
            _err(f"rewrote {args.certificate}")
            for key, value in changed.metadata.items():
                _err(f"    {key} = {value}")
            return
        if "/" in args.name or args.name in ("", ".", ".."):
            raise KeyFileError(f"{args.name!r} is not a name for a key")
        public, secret = create_key_pair(args.directory, args.name, _metadata(args))
        _err(f"wrote {public} and {secret}")
        _out(read_certificate(public).public.decode("ascii"))
    except (KeyFileError, ValueError, OSError) as error:
        _err(f"{prog}: {error}")
        raise SystemExit(1) from None


def mc0_keys_main() -> None:
    """``mc0-keys NAME DIR``: the former name of ``bus-keys``."""
    main(prog="mc0-keys")


def _out(line: str) -> None:
    sys.stdout.write(line + "\n")


def _err(line: str) -> None:
    sys.stderr.write(line + "\n")


if __name__ == "__main__":
    main()
