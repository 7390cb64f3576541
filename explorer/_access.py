"""Who may use a served explorer (``partex serve``): the password its page asks for (Panel's
basic auth) and the rule that a server other machines reach asks for one. Imports no Panel.

A password never travels on a command line: ``partex serve`` reads it from a file
(``--auth-file``) or its own environment (``PARTEX_PASSWORD``) and hands the Panel server a
private copy of the file (``write_credentials``), naming only its path.
"""

from __future__ import annotations

import ipaddress
import json
import os
import pathlib

from partex import PartexError

PASSWORD_ENV = "PARTEX_PASSWORD"  # one password (any user name), where no --auth-file is given

# What the operator allows the page, passed to the server in its environment: the folder the
# page may load models of its users' own from (``--models-dir``; unset: none, the demo
# models only), the largest file it takes (``--max-upload``, bytes) and how many pages'
# searches run at once (``--search-workers``; unset: one fewer than the machine's cores) and
# how many pages may be open at once (``--max-pages``; unset: what the machine's memory holds).
MODELS_DIR_ENV = "PARTEX_MODELS_DIR"
MAX_UPLOAD_ENV = "PARTEX_MAX_UPLOAD"
SEARCH_WORKERS_ENV = "PARTEX_SEARCH_WORKERS"
MAX_PAGES_ENV = "PARTEX_MAX_PAGES"
MAX_UPLOAD = 4 * 2**20  # a plan file of a large model is a few hundred KiB
AUTH_FILE_FORM = 'a JSON object {"user": "password", ...} or one line holding a password'

Credentials = dict[str, str] | str  # user -> password, or one password for any user name


def is_loopback(address: str) -> bool:
    """Whether only this machine reaches a server bound to ``address``: ``localhost``,
    127.0.0.0/8 or ``::1`` (``0.0.0.0``, ``""``, ``::`` and any other name or address: no)."""
    text = (address or "").strip().strip("[]").lower()
    if text == "localhost":
        return True
    try:
        return ipaddress.ip_address(text).is_loopback
    except ValueError:
        return False


def read_credentials(path: str | os.PathLike) -> Credentials:
    """The credentials in the file at ``path``: a JSON object of user name -> password
    (non-empty strings), or one line holding a password (for any user name). PartexError
    naming the file for anything else; no message quotes the file's content."""
    try:
        text = pathlib.Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise PartexError(f"--auth-file {path}: cannot read it ({e.strerror}): give {AUTH_FILE_FORM}") from None
    except UnicodeDecodeError:
        raise PartexError(f"--auth-file {path} is not UTF-8 text: give {AUTH_FILE_FORM}") from None
    if text.lstrip().startswith("{"):
        try:
            users = json.loads(text)
        except json.JSONDecodeError as e:
            raise PartexError(f"--auth-file {path} is not valid JSON (line {e.lineno}, column {e.colno}): give "
                              f"{AUTH_FILE_FORM}") from None
        if not users or not all(isinstance(k, str) and k and isinstance(v, str) and v for k, v in users.items()):
            raise PartexError(f"--auth-file {path}: every user name and password must be a non-empty string: give "
                              f"{AUTH_FILE_FORM}")
        return users
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) != 1:
        raise PartexError(f"--auth-file {path} holds {len(lines)} lines: give {AUTH_FILE_FORM}")
    return lines[0]


def credentials(auth_file: str | os.PathLike | None, env: dict[str, str]) -> Credentials | None:
    """The credentials a server asks for: those in ``auth_file`` (``read_credentials``), else
    the password in ``env``'s PARTEX_PASSWORD, else None (no password asked)."""
    if auth_file is not None:
        return read_credentials(auth_file)
    password = env.get(PASSWORD_ENV, "").strip()
    return password or None


def check_exposure(address: str, protected: bool, insecure: bool) -> None:
    """Refuse (PartexError) a server on ``address`` that other machines reach with no
    password asked (``protected`` False), unless the operator said ``insecure``: anyone
    reaching that page runs searches, verifications and measurements on this machine."""
    if protected or insecure or is_loopback(address):
        return
    raise PartexError(f"--address {address or repr(address)} lets other machines reach the explorer, which then runs their work "
                      f"on this one: ask for a password with --auth-file FILE ({AUTH_FILE_FORM}) or "
                      f"{PASSWORD_ENV}=..., or pass --insecure to serve it with none")


def write_credentials(creds: Credentials, folder: str | os.PathLike) -> str:
    """Write ``creds`` as the file Panel's ``--basic-auth`` reads (JSON: an object, or a string
    for one password) in ``folder``, readable by this user only; returns its path."""
    path = os.path.join(folder, "basic-auth.json")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(creds, f)
    return path
