"""The `digest` table of a catalog type: window length, actor and dedup bounds, line texts.

Parsed when the catalog loads (`herald.catalog` calls `parse_digest_config`); used by
`herald.digest` (windows) and `herald.render` (digest lines). Re-exported by `herald.digest`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

from herald.catalog_fields import Fields, ParseContext
from herald.templates import check_variables

__all__ = ["DigestConfig", "DigestText", "parse_digest_config"]

_DIRECT = timedelta(milliseconds=1)
_TEXT_VARS = frozenset({"actors", "others", "total"})


@dataclass(frozen=True, slots=True)
class DigestText:
    """Digest line templates of one locale: `few` (every actor named), `many`, `many_one`."""

    few: str
    many: str
    many_one: str | None = None


@dataclass(frozen=True, slots=True)
class DigestConfig:
    """The `digest` table of a catalog type; `window_seconds == 0` means direct."""

    event_type: str
    window_seconds: int
    max_actors: int
    max_seen_ids: int
    texts: Mapping[str, DigestText]

    @property
    def window(self) -> timedelta:
        """Window length; a direct type gets 1 ms so consecutive windows have distinct starts."""
        return timedelta(seconds=self.window_seconds) if self.window_seconds else _DIRECT

    @property
    def window_ms(self) -> int:
        """`window` in milliseconds."""
        return self.window_seconds * 1000 if self.window_seconds else 1

    @property
    def seen_slack(self) -> int:
        """How far the seen-id set may outgrow `max_seen_ids` before it is trimmed (in bulk)."""
        return max(1, self.max_seen_ids // 8)


def parse_digest_config(f: Fields, ctx: ParseContext) -> DigestConfig:
    """Parse and validate `types.<name>.digest` (called by `herald.catalog`)."""
    texts: dict[str, DigestText] = {}
    for tag in f.get("text", dict):
        t = f.sub("text").sub(tag)
        text = DigestText(t.get("few", str), t.get("many", str), t.get("many_one", str, None))
        for key in ("few", "many", "many_one"):
            if getattr(text, key) is not None:
                check_variables(t, key, getattr(text, key), _TEXT_VARS)
        t.close()
        texts[f.locale(f"text.{tag}", tag)] = text
    if ctx.default_locale not in texts:
        raise f.error("text", f"needs the catalog default locale {ctx.default_locale!r}")
    config = DigestConfig(
        event_type=f.get("event_type", str),
        window_seconds=f.integer("window_seconds", 0),
        max_actors=f.integer("max_actors", 1, 3),
        max_seen_ids=f.integer("max_seen_ids", 1, 4096),
        texts=texts,
    )
    f.close()
    return config
