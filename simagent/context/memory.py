"""Workspace memory: a ``MEMORY.md`` index plus one markdown file per note.

Only the index enters the prompt (progressive disclosure); notes are read on demand with
``read_file``. ``remember`` writes a note and keeps its index line unique, so saving is
cheap and never needs approval. The seed comes from the bundled ``memory/`` folder.
Notes are state: private files, and a secret's value in a title or body is redacted
before it is written (the index line enters every later prompt).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from simagent.paths import content_dir, private_dir, private_opener, workspace_state_dir
from simagent.trace.redact import redact

INDEX = "MEMORY.md"
KINDS = ("project", "user", "simulator", "preference", "reference")
_SLUG = re.compile(r"[^a-z0-9]+")


def memory_dir(workspace: str | Path) -> Path:
    return workspace_state_dir(workspace) / "memory"


def ensure_memory(workspace: str | Path) -> Path:
    """The workspace's memory folder, seeded from the bundled ``memory/`` on first use."""
    target = memory_dir(workspace)
    if not (target / INDEX).is_file():
        private_dir(target)
        seed = content_dir("memory")
        for item in seed.iterdir() if seed.is_dir() else []:
            dest = target / item.name
            if item.is_file() and not dest.exists():
                _write(dest, item.read_text(encoding="utf-8"))
        if not (target / INDEX).exists():
            _write(target / INDEX, "# Workspace memory\n")
    return target


def _write(path: Path, text: str) -> None:
    with open(path, "w", encoding="utf-8", opener=private_opener) as fh:
        fh.write(redact(text))


def slugify(title: str) -> str:
    return _SLUG.sub("-", title.lower()).strip("-")[:48] or "note"


@dataclass(frozen=True)
class SavedNote:
    path: Path
    created: bool


def remember(folder: Path, title: str, content: str, kind: str = "project") -> SavedNote:
    """Write ``<slug>.md`` (frontmatter + body) and add or refresh its index line."""
    # brackets would break the index line's markdown link
    # redacted before the slug: a key in a title would otherwise name the file
    title = " ".join(redact(title).replace("[", "(").replace("]", ")").split()) or "note"
    kind = kind if kind in KINDS else "project"
    slug = slugify(title)
    path = folder / f"{slug}.md"
    created = not path.exists()
    first = next((ln.strip() for ln in content.splitlines() if ln.strip()), "")
    summary = first if len(first) <= 100 else first[:99] + "…"
    _write(path, f"---\nname: {title}\ndescription: {summary}\ntype: {kind}\n---\n"
                 f"{content.rstrip()}\n")
    index = folder / INDEX
    lines = index.read_text(encoding="utf-8").splitlines() if index.exists() else [
        "# Workspace memory"]
    marker = f"({slug}.md)"
    entry = f"- [{title}]({slug}.md) ({kind}) - {summary}"
    lines = [ln for ln in lines if marker not in ln] + [entry]
    _write(index, "\n".join(lines) + "\n")
    return SavedNote(path, created)


_ENTRY = re.compile(r"^- \[(?P<title>.+?)\]\((?P<file>[^)\s]+\.md)\)(?: \((?P<kind>[a-z]+)\))?"
                    r"(?: - (?P<summary>.*))?$")


@dataclass(frozen=True)
class NoteInfo:
    title: str
    file: str
    kind: str
    summary: str
    exists: bool


def list_notes(folder: Path) -> list[NoteInfo]:
    """The index entries (what the model sees), each checked against the note files."""
    index = folder / INDEX
    if not index.exists():
        return []
    notes = []
    for line in index.read_text(encoding="utf-8").splitlines():
        m = _ENTRY.match(line.strip())
        if m:
            notes.append(NoteInfo(m["title"], m["file"], m["kind"] or "", m["summary"] or "",
                                  (folder / m["file"]).is_file()))
    return notes


def read_note(folder: Path, name: str) -> tuple[Path, str]:
    """A note by file name, slug or title (case-insensitive prefix); LookupError lists them."""
    notes = list_notes(folder)
    key = name.strip().lower()
    for match in (lambda n: n.file.lower() in (key, f"{key}.md"),
                  lambda n: n.title.lower() == key or slugify(n.title) == slugify(name),
                  lambda n: n.title.lower().startswith(key)):
        hits = [n for n in notes if match(n)]
        if len(hits) == 1 and hits[0].exists:
            path = folder / hits[0].file
            return path, path.read_text(encoding="utf-8")
    known = ", ".join(n.file for n in notes) or "none yet"
    raise LookupError(f"no single memory note matches {name!r} (notes: {known})")


def render_notes(notes: list[NoteInfo], folder: Path) -> str:
    """The ``/memory`` listing: one line per note, missing files flagged."""
    if not notes:
        return f"No memory notes yet ({folder}). The agent saves them with `remember`.\n"
    width = max(len(n.title) for n in notes)
    lines = [f"Memory ({folder}):"]
    for n in notes:
        flag = "" if n.exists else "  [file missing]"
        lines.append(f"  {n.title.ljust(width)}  {n.kind or '-':<10} {n.summary}{flag}")
    return "\n".join(lines) + "\n"
