"""Where the CLI finds the server and the token: flags, then the environment
(FAIRQ_URL, FAIRQ_TOKEN), then ~/.config/fairq/config.toml (or $XDG_CONFIG_HOME)."""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit


class ConfigError(Exception):
    pass


@dataclass(frozen=True)
class Config:
    url: str
    token: str
    utc: bool = False  # times in UTC rather than the local zone (docs/cli.md, "Times")


def config_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "fairq" / "config.toml"


def load_config(*, url: str | None, token: str | None, profile: str | None = None,
                path: Path | None = None) -> Config:
    """Flags win over the environment, which wins over the file. The file holds
    `url` and `token` at the top level or in `[profiles.<name>]` (FAIRQ_PROFILE)."""
    file_values: dict[str, str] = {}
    path = path or config_path()
    if path.exists():
        try:
            data = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read {path}: {exc}") from exc
        profile = profile or os.environ.get("FAIRQ_PROFILE")
        section = data.get("profiles", {}).get(profile, {}) if profile else data
        if profile and not section:
            raise ConfigError(f"no profile {profile!r} in {path}")
        file_values = {k: str(v) for k, v in section.items() if k in {"url", "token"}}
        if "utc" in section or "utc" in data:
            file_values["utc"] = str(section.get("utc", data.get("utc"))).lower()
    where = "--url" if url else "FAIRQ_URL" if os.environ.get("FAIRQ_URL") else str(path)
    url = url or os.environ.get("FAIRQ_URL") or file_values.get("url") or ""
    token = token or os.environ.get("FAIRQ_TOKEN") or file_values.get("token") or ""
    if not url:
        raise ConfigError(f"no server URL: pass --url, set FAIRQ_URL or write url in {path}")
    check_url(url, where)
    if not token:
        raise ConfigError(f"no API token: pass --token, set FAIRQ_TOKEN or write token in {path}")
    env_utc = os.environ.get("FAIRQ_UTC", "").strip().lower()
    utc = (env_utc or file_values.get("utc", "")) in {"1", "true", "yes"}
    return Config(url=url.rstrip("/"), token=token, utc=utc)


def check_url(url: str, where: str) -> None:
    """A server URL names its scheme and host: `fq.example.org` or `localhost:8000`
    alone is refused with what to write instead, rather than guessed (https would fail
    on a plain-HTTP dev server; http would send the token in the clear)."""
    parts = urlsplit(url.strip())
    if parts.scheme in ("http", "https") and parts.netloc:
        return
    bare = url.strip()
    if parts.scheme in ("http", "https"):
        raise ConfigError(f"the server URL {bare!r} ({where}) names no host: "
                          "write https://HOST[:PORT]")
    raise ConfigError(f"the server URL {bare!r} ({where}) must start with https:// or "
                      f"http:// (e.g. https://{bare.split('://')[-1]})")
