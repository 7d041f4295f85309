"""modsent.reporting: the HTML pages of the Markdown summaries that the Snakemake report shows."""

from html.parser import HTMLParser

from modsent.reporting import html_path, markdown_to_html, write_html

TABLE = """# Evaluation summary · tiny

Rows: variants. BM: xsim error rate % (lower is better).

| variant | BM builtin_parallel xsim err ↓ | RSIM builtin_parallel |
|---|---:|---:|
| base | 22.2 | 0.602 |
| Mod_m <script>alert(1)</script> | 70.8 | 0.304 |
"""


class Cells(HTMLParser):
    """The text of every table cell, row by row, with the cells' alignment."""

    def __init__(self):
        super().__init__()
        self.rows, self.align, self.title, self._in = [], [], None, None

    def handle_starttag(self, tag, attrs):
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            self._in = tag
            self.rows[-1].append("")
            self.align.append(dict(attrs).get("style"))
        elif tag == "title":
            self._in = "title"

    def handle_endtag(self, tag):
        self._in = None

    def handle_data(self, data):
        if self._in in ("td", "th"):
            self.rows[-1][-1] += data
        elif self._in == "title":
            self.title = data


def test_a_markdown_table_becomes_an_html_table_with_its_alignment_and_escaped_text():
    page = markdown_to_html(TABLE)
    assert page.startswith("<!DOCTYPE html>") and "<script>" not in page  # raw HTML is text, not markup
    cells = Cells()
    cells.feed(page)
    assert cells.title == "Evaluation summary · tiny"
    assert cells.rows == [["variant", "BM builtin_parallel xsim err ↓", "RSIM builtin_parallel"],
                          ["base", "22.2", "0.602"],
                          ["Mod_m <script>alert(1)</script>", "70.8", "0.304"]]
    # the variant column is left as written, the numbers right-aligned as `---:` says
    assert cells.align[:3] == [None, "text-align:right", "text-align:right"]
    assert "lower is better" in page


def test_write_html_puts_the_page_beside_the_markdown(tmp_path):
    md = tmp_path / "summary.md"
    md.write_text(TABLE, encoding="utf-8")
    out = write_html(md)
    assert out == html_path(md) == tmp_path / "summary.html"
    assert out.read_text(encoding="utf-8") == markdown_to_html(TABLE)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.html", "summary.md"]  # nothing left behind
    other = write_html(md, tmp_path / "page.html", title="Table 1")
    assert "<title>Table 1</title>" in other.read_text(encoding="utf-8")
