"""The auth file: the cluster credential and the client tokens with their roles.

    # tally auth file: TOML, readable by its owner only (mode 0600)
    cluster = "a long random secret"          # servers only; never give it to a client

    [clients.dashboards]
    token = "another long random secret"
    role = "read"                             # read | write | admin
    consumers = ["dashboards-*"]              # optional: consumer names it owns (globs)
    owners = ["billing-*"]                    # optional: lock owner ids it owns (globs)

TOML because operators write this file by hand and comment it, and Python reads it with the
standard library (tomllib). Secrets come from a file (or the file's path from the environment),
never from the command line, where every local user can read them in the process list. A file
that its group or others may read is refused, as ssh refuses such a key.

`Credentials.principal(header)` maps an `authorization: Bearer <secret>` header to its
principal, comparing against every known secret in constant time.
"""

from __future__ import annotations

import hmac
import os
import secrets
import stat
import tomllib

from locks.ownership import CONSUMERS, OWNERS, Grants
from tally.errors import InvalidOptionError
from tally.server.access import CLIENT_ROLES, CLUSTER, Principal

MIN_SECRET_CHARS = 16


def _secret(path: str, where: str, value) -> str:
    if not isinstance(value, str) or len(value) < MIN_SECRET_CHARS:
        raise InvalidOptionError(
            f"auth file {path}: {where} must be a string of at least {MIN_SECRET_CHARS} "
            "characters (e.g. from `python -c 'import secrets; print(secrets.token_urlsafe())'`)")
    return value


class Credentials:
    """The secrets a server accepts and the principal each stands for."""

    def __init__(self, cluster: str, clients: dict[str, tuple[str, str]],
                 grants: dict[str, dict[str, tuple[str, ...]]] | None = None) -> None:
        """`clients`: name -> (token, role); `grants`: name -> {"owners"/"consumers": globs}."""
        self.cluster = cluster
        self.clients = dict(clients)
        self.grants = Grants(grants, principals=clients)
        self._known: list[tuple[bytes, Principal]] = [
            (f"Bearer {cluster}".encode(), Principal("the cluster credential", CLUSTER))]
        for name, (token, role) in clients.items():
            self._known.append((f"Bearer {token}".encode(),
                                Principal(f"client {name!r}", role, name, self.grants)))

    @classmethod
    def load(cls, path: str) -> "Credentials":
        try:
            mode = os.stat(path).st_mode
            with open(path, "rb") as f:
                doc = tomllib.load(f)
        except FileNotFoundError:
            raise InvalidOptionError(f"auth file {path} does not exist") from None
        except tomllib.TOMLDecodeError as e:
            raise InvalidOptionError(f"auth file {path} is not valid TOML: {e}") from None
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise InvalidOptionError(
                f"auth file {path} may be read by its group or others (mode "
                f"{stat.S_IMODE(mode):o}); chmod 600 it")
        unknown = sorted(set(doc) - {"cluster", "clients"})
        if unknown:
            raise InvalidOptionError(f"auth file {path}: unknown keys {unknown}; "
                                     "expected cluster and [clients.<name>] tables")
        cluster = _secret(path, "cluster", doc.get("cluster"))
        clients: dict[str, tuple[str, str]] = {}
        seen = {cluster}
        table = doc.get("clients", {})
        if not isinstance(table, dict):
            raise InvalidOptionError(f"auth file {path}: clients must be a table of clients")
        grants: dict[str, dict[str, tuple[str, ...]]] = {}
        for name, entry in table.items():
            if not isinstance(entry, dict) or not {"token", "role"} <= set(entry) or \
                    set(entry) - {"token", "role", OWNERS, CONSUMERS}:
                raise InvalidOptionError(
                    f"auth file {path}: client {name!r} needs exactly a token and a role, and "
                    f"may have {OWNERS} and {CONSUMERS} (lists of glob patterns)")
            for kind in (OWNERS, CONSUMERS):
                patterns = entry.get(kind, [])
                if not isinstance(patterns, list) or \
                        not all(isinstance(p, str) and p for p in patterns):
                    raise InvalidOptionError(
                        f"auth file {path}: {kind} of client {name!r} must be a list of "
                        f"non-empty glob patterns (e.g. [\"billing-*\"]), got {patterns!r}")
                grants.setdefault(name, {})[kind] = tuple(patterns)
            token = _secret(path, f"the token of client {name!r}", entry["token"])
            if entry["role"] not in CLIENT_ROLES:
                raise InvalidOptionError(
                    f"auth file {path}: client {name!r} has role {entry['role']!r}; a client "
                    f"role is one of {list(CLIENT_ROLES)}")
            if token in seen:
                raise InvalidOptionError(
                    f"auth file {path}: the token of client {name!r} is used twice (or is the "
                    "cluster credential); each principal needs its own")
            seen.add(token)
            clients[name] = (token, entry["role"])
        return cls(cluster, clients, grants)

    def principal(self, header: str | None) -> Principal | None:
        """The principal of an `authorization` header value, or None for an unknown one. Every
        known secret is compared, each in constant time, so the time taken does not tell which
        prefix or which principal came close."""
        given = (header or "").encode()
        found = None
        for expected, principal in self._known:
            if hmac.compare_digest(given, expected):
                found = principal
        return found


def write_auth_file(path: str, cluster: str, clients: dict[str, tuple[str, str]],
                    grants: dict[str, dict[str, list[str]]] | None = None) -> None:
    """Write an auth file readable by its owner only (LocalCluster makes one for its tests);
    `grants`: client name -> {"owners"/"consumers": glob patterns}."""
    lines = [f'cluster = "{cluster}"']
    for name, (token, role) in clients.items():
        lines += ["", f"[clients.{name}]", f'token = "{token}"', f'role = "{role}"']
        for kind, patterns in (grants or {}).get(name, {}).items():
            lines.append(f"{kind} = [{', '.join(repr(str(p)) for p in patterns)}]")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # an existing file keeps its mode through O_CREAT
    with os.fdopen(fd, "w") as f:
        f.write("\n".join(lines) + "\n")


def new_secret() -> str:
    return secrets.token_urlsafe(32)
