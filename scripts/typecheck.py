"""mypy --strict over the examples and the README's Python snippets, against
the installed ascmem's stubs (_core.pyi, py.typed).  CI runs it; so can you:

    python scripts/typecheck.py

Errors inside ascmem's own modules are not reported here (--follow-imports
silent): this checks what a user's code sees."""
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def readme_snippets():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        text = f.read()
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def main():
    with tempfile.TemporaryDirectory() as tmp:
        files = [os.path.join(ROOT, "examples", f) for f in sorted(os.listdir(os.path.join(ROOT, "examples")))
                 if f.endswith(".py")]
        for i, code in enumerate(readme_snippets()):
            path = os.path.join(tmp, f"readme_snippet_{i}.py")
            with open(path, "w", encoding="utf-8") as f:
                f.write(code)
            files.append(path)
        cmd = [sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent",
               "--no-incremental", *files]
        print("$", " ".join(os.path.relpath(c, ROOT) if c.startswith(ROOT) else c for c in cmd[2:]))
        return subprocess.call(cmd, cwd=tmp)  # not the source tree: the installed package


if __name__ == "__main__":
    sys.exit(main())
