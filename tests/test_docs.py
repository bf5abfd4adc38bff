"""The README and the docs pages: short, every relative link resolves, the reference tables are
generated from the code (not copied), and the add-an-objective recipe they show really works.

`mkdocs build --strict` (make docs, run by .ci/run) checks the built site itself; these tests are
the cheap part that needs no MkDocs."""

from __future__ import annotations

import importlib.util
import re
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
README_MAX_LINES = 250

_spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "tools" / "docs_hooks.py")
hooks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hooks)

# [text](target) and ![alt](target); reference-style links are not used in these pages
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`[^`\n]*`")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)


def prose(markdown: str) -> str:
    """The text outside fenced code blocks and code spans (links there are not links)."""
    return INLINE_CODE.sub("", FENCE.sub("", markdown))


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def mkdocs_slug(heading: str) -> str:
    """Python-Markdown's toc slugify (MkDocs' default): ASCII only, runs of spaces/hyphens to one."""
    text = unicodedata.normalize("NFKD", heading).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


SNIPPET = re.compile(r'^--8<-- "([^"]+)"$', re.MULTILINE)


def page_text(path: Path) -> str:
    """A page as MkDocs renders it: snippets included, generated tables filled in."""
    text = path.read_text(encoding="utf-8")
    if DOCS in path.parents:
        text = hooks.expand(SNIPPET.sub(lambda m: (ROOT / m.group(1)).read_text(encoding="utf-8"), text))
    return text


def anchors(path: Path, slug) -> set[str]:
    text = page_text(path)
    headings = [INLINE_CODE.sub(lambda m: m.group(0).strip("`"), h) for h in HEADING.findall(FENCE.sub("", text))]
    return {slug(re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", h)) for h in headings}


def broken_links(page: Path, slug) -> list[str]:
    out = []
    for target in LINK.findall(prose(page.read_text(encoding="utf-8"))):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("//"):
            continue  # https:, mailto:: not ours to check offline
        path_part, _, fragment = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        if not dest.exists():
            out.append(f"{page.name}: {target} (no such file)")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest, slug):
            out.append(f"{page.name}: {target} (no heading #{fragment} in {dest.name})")
    return out


def test_readme_is_short():
    lines = len(README.read_text(encoding="utf-8").splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; reference material goes to docs/"


def test_every_relative_link_in_the_readme_resolves():
    assert not broken_links(README, github_slug)


def test_every_relative_link_in_the_docs_resolves():
    pages = sorted(DOCS.rglob("*.md"))
    assert len(pages) >= 10
    broken = [b for page in pages for b in broken_links(page, mkdocs_slug)]
    assert not broken, broken


def test_the_link_checker_finds_broken_links(tmp_path):
    (tmp_path / "there.md").write_text("# A heading\n", encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text("[ok](there.md#a-heading) [gone](missing.md) [bad anchor](there.md#nope)\n"
                    "`[in code](missing2.md)` [web](https://example.org/x)\n", encoding="utf-8")
    assert broken_links(page, github_slug) == ["page.md: missing.md (no such file)",
                                               "page.md: there.md#nope (no heading #nope in there.md)"]


def test_every_marker_in_the_docs_names_a_generator():
    names = {m.group(1) for page in DOCS.rglob("*.md") for m in hooks.MARKER.finditer(page.read_text(encoding="utf-8"))}
    assert {"config-fields", "objective-presets", "layers"} <= names
    assert names <= set(hooks.GENERATORS)
    with pytest.raises(ValueError, match="unknown generated table 'nope'"):
        hooks.expand("text\n<!-- generated: nope -->\n")


def test_the_config_reference_is_generated_from_the_code(monkeypatch):
    from armorlab.core import config

    page = hooks.expand((DOCS / "config-reference.md").read_text(encoding="utf-8"))
    for key in config.FIELDS:
        assert f"| `{key}` |" in page, key
    for task, fields in config.TASK_FIELDS.items():
        assert f"`task: {task}`" in page
        assert all(f"| `task.{key}` |" in page for key in fields)
    assert all(f"| `model.{key}` |" in page for key in config.MODEL_FIELDS_TINY)
    assert "| `max_steps` | `60` | `500` |" in page  # TINY_DEFAULTS and REAL_DEFAULTS side by side
    # a field added to the code appears without an edit to the page
    monkeypatch.setitem(config.FIELDS, "brand_new_knob", config.Field(3, int, "a knob | with a pipe", type=int | None))
    row = hooks.config_fields().splitlines()[-1]
    assert row == "| `brand_new_knob` | `3` | int or null | a knob \\| with a pipe |"


def test_the_objective_table_follows_the_registry():
    from armorlab.algos.objectives import Batch, Surrogate, register_objective, unregister_objective

    @register_objective("doc_probe", aggregation="seq-mean", capacity="mixed", sequence_level=True,
                        defaults={"epsilon": 0.05}, params={"probe_t": 2.0, "probe_beta": None})
    def doc_probe(b: Batch) -> Surrogate:
        """Probe objective (Eq. 1 of nothing). Second sentence."""
        raise NotImplementedError

    try:
        row = [r for r in hooks.objective_presets().splitlines() if r.startswith("| `doc_probe` |")]
        assert row == ["| `doc_probe` | Probe objective (Eq. 1 of nothing). | `seq-mean` | `mixed` | yes | no | "
                       "`epsilon: 0.05` | `probe_t: 2.0`, `probe_beta: required` |"]
    finally:
        unregister_objective("doc_probe")
    armor = [r for r in hooks.objective_presets().splitlines() if r.startswith("| `armor` |")][0]
    assert "`anchor: true`" in armor and "`ref_reset_steps: 160`" in armor and "| yes |" in armor


def test_the_layer_table_is_the_import_contracts():
    from tests.test_layout import PACKAGE, TORCH_FREE

    assert hooks.torch_free() == TORCH_FREE
    on_disk = {p.stem for p in PACKAGE.iterdir() if p.suffix == ".py" or (p / "__init__.py").is_file()}
    assert set(hooks.parts()) == on_disk  # every part has its place, once
    table = hooks.layers()
    assert "| 4 | `armorlab/train/`, `armorlab/tune/` |" in table  # top first: __main__, cli, commands, ...
    assert "- No import circles between modules (`acyclic_siblings`)" in table


def test_generated_tables_render_for_every_generator():
    for name, generate in hooks.GENERATORS.items():
        out = generate()
        assert out.strip(), name


def recipe_blocks(path: Path) -> list[str]:
    blocks = re.findall(r"^```python\n(.*?)^```", path.read_text(encoding="utf-8"), re.MULTILINE | re.DOTALL)
    return [b for b in blocks if "@register_objective" in b]


@pytest.mark.parametrize("path", [README, DOCS / "objectives.md"], ids=lambda p: p.name)
def test_the_add_an_objective_recipe_works_as_printed(path):
    import torch

    from armorlab import policy_loss, resolve
    from armorlab.algos.objectives import objective_spec, unregister_objective

    (block,) = recipe_blocks(path)
    assert "_Batch" not in block and "_clipped" not in block  # public names only
    try:
        exec(compile(block, str(path), "exec"), {"__name__": "recipe"})
        assert resolve({"objective": "sym_ppo"})["epsilon"] == 0.1  # its preset
        assert objective_spec("sym_ppo").capacity == "clipped"
        # ratios 1.3 and 1.05 at A = +1, ε_low = 0.1: the symmetric clip caps the first at 1.1 (dapo's
        # ε_high = 0.28 would not); token-mean of −A·clamp(r) = −(1.1 + 1.05)/2
        logp = torch.log(torch.tensor([[1.3, 1.05]]))
        out = policy_loss("sym_ppo", logp, torch.zeros(1, 2), torch.tensor([1.0]), torch.ones(1, 2),
                          eps_low=0.1, eps_high=0.28)
        assert float(out.loss) == pytest.approx(-(1.1 + 1.05) / 2)
    finally:
        unregister_objective("sym_ppo")


def test_every_docs_page_is_in_the_nav():
    """mkdocs --strict only mentions a page left out of the nav (INFO): a page no menu reaches."""
    import yaml

    # the nav section alone: the rest of mkdocs.yml holds !!python tags safe_load refuses
    nav = yaml.safe_load("nav:" + (ROOT / "mkdocs.yml").read_text(encoding="utf-8").split("\nnav:", 1)[1])
    listed: set[str] = set()

    def walk(node):
        if isinstance(node, str):
            listed.add(node)
        elif isinstance(node, list):
            for item in node:
                walk(item)
        elif isinstance(node, dict):
            for value in node.values():
                walk(value)

    walk(nav)
    pages = {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")}
    assert not pages - listed, f"add to mkdocs.yml's nav: {sorted(pages - listed)}"
