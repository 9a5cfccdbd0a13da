"""grpo_lab.tables: results as a table (HTML in JupyterLab, aligned text when printed)."""
from grpo_lab.tables import Table


def test_text_table_is_aligned_numbers_right_text_left():
    t = Table([{"name": "grpo", "n": 3, "x": 0.123456}, {"name": "dr_grpo", "n": 12, "x": 2.0}])
    assert str(t).splitlines() == [
        "name      n       x",
        "-------  --  ------",
        "grpo      3  0.1235",
        "dr_grpo  12       2",
    ]


def test_from_dict_and_html_escape_and_missing_cells():
    t = Table.from_dict({"a<b": [1.0, 0.5], "c": None}, key="k", value="v")
    assert t.columns == ["k", "v"] and t.cells() == [["a<b", "[1, 0.5]"], ["c", ""]]
    assert "<td>a&lt;b</td>" in t._repr_html_()
    nested = Table.from_dict({"run": {"steps": 10, "acc": 0.5}})
    assert nested.columns == ["name", "steps", "acc"] and nested.cells() == [["run", "10", "0.5"]]


def test_doc_is_whole_or_cut_between_paragraphs_with_where_to_read_the_rest():
    from grpo_lab.tables import doc
    text = "First line.\n\nSecond paragraph, two\nlines.\n\nThird."
    assert doc(text) == text and doc(text, 1000) == text
    assert doc(text, 41) == "First line.\n\nSecond paragraph, two\nlines.\n\n[... 1 more lines: help(it)]"
    assert doc(text, 5).startswith("First line.\n\n[... 4 more lines")   # at least one paragraph

    def f():
        """Alpha.

        Beta gamma."""
    assert doc(f, 8).endswith("help(test_tables.test_doc_is_whole_or_cut_between_paragraphs_"
                              "with_where_to_read_the_rest.<locals>.f)]")
