"""What an operator reads before opening a gate shows every character that hides or reorders
text (`tether.supervisor.shown`), on the CLI and on the status page."""

from __future__ import annotations

from tether.supervisor.shown import reveal, reveal_all
from tether.supervisor.ui.effects import shown_request

DISGUISED = "pay \u202e000,28$ now\u200b"


def test_bidi_and_zero_width_characters_are_written_as_escapes() -> None:
    assert reveal(DISGUISED) == "pay \\u202e000,28$ now\\u200b"
    assert reveal("caf\u00e9 \u20ac 5\n\tnext") == "caf\u00e9 \u20ac 5\n\tnext"  # plain text stays
    assert reveal_all({"k\u200b": [DISGUISED, 3]}) == {"k\\u200b": [reveal(DISGUISED), 3]}


def test_the_pages_request_reveals_them_in_every_part() -> None:
    request = {
        "method": "POST",
        "url": "https://pay.example/\u202eexe.txt",
        "headers": {"X-Note": DISGUISED},
        "body": {"amount": DISGUISED},
    }
    shown = shown_request("http", request)
    assert "\u202e" not in shown["url"]
    assert "\\u202e" in shown["url"]
    assert shown["headers"][0]["value"] == reveal(DISGUISED)
    assert "\u202e" not in shown["body"]
    assert "\\u202e" in shown["body"]
    assert "\\\\u202e" not in shown["body"]  # escaped once, not twice
