"""Reports show untrusted text (ids, systems, dialogue and claim text) verbatim, never as markup."""

import io

from rich.console import Console

from fastvista.labels import Label
from fastvista.schema import Claim, Dialogue, ScoredDialogue, Turn, TurnResult
from fastvista.infer.report import terminal_table, write_html

HOSTILE_ID = "[/]bad [bold]x"


def scored(id: str, system: str, text: str, claim: str) -> ScoredDialogue:
    dialogue = Dialogue(id=id, system=system, turns=[Turn(role="user", text="hi"), Turn(role="assistant", text=text)])
    result = TurnResult(index=1, claims=[Claim(text=claim, label=Label.VERIFIED)], score=1.0, no_claims=False, hallucinated=False)
    return ScoredDialogue(id=id, source="test", system=system, score=1.0, turns=[result], dialogue=dialogue)


def test_terminal_table_prints_ids_and_systems_verbatim():
    console = Console(record=True, width=200, file=io.StringIO())
    console.print(terminal_table([scored(HOSTILE_ID, "[red]sys :thumbs_up:", "t", "c")]))
    text = console.export_text()
    assert HOSTILE_ID in text and "[red]sys :thumbs_up:" in text


def test_terminal_table_shows_control_characters_instead_of_sending_them():
    console = Console(width=200, file=io.StringIO())
    console.print(terminal_table([scored("a\x1b[31mred\x1b]0;title\x07", "s\x9bm", "t", "c")]))
    out = console.file.getvalue()
    assert "\x1b" not in out and "\x07" not in out and "\x9b" not in out
    assert r"a\x1b[31mred\x1b]0;title\x07" in out and r"s\x9bm" in out


def test_html_report_escapes_every_untrusted_string(tmp_path):
    path = tmp_path / "report.html"
    write_html([scored("<script>id</script>", '"><i>sys', "<b>turn</b> & more", "<img src=x onerror=alert(1)>")], path)
    page = path.read_text()
    assert "<script>" not in page and "<b>turn" not in page and "<img" not in page and "<i>sys" not in page
    for shown in ("&lt;script&gt;id&lt;/script&gt;", "&quot;&gt;&lt;i&gt;sys", "&lt;b&gt;turn&lt;/b&gt; &amp; more", "&lt;img src=x onerror=alert(1)&gt;"):
        assert shown in page
