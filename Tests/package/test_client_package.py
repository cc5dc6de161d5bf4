"""HeraldClient can be built for iOS and macOS: on Apple platforms its
dependency graph holds no system library (libwebsockets, OpenSSL, the
Debian SQLite), and every import of a Linux-only module in its sources is
behind `#if canImport(...)`.

No Apple SDK is on these machines, so the check reads the manifest as
SwiftPM resolves it: `swift package dump-package` gives each dependency's
platform condition (`describe --type json` drops them).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
APPLE = ("ios", "macos")


def swift() -> str:
    found = shutil.which("swift") or ("/opt/swift/usr/bin/swift" if os.path.exists("/opt/swift/usr/bin/swift") else None)
    if not found:
        pytest.fail("swift is not on PATH", pytrace=False)
    return found


@pytest.fixture(scope="module")
def manifest(tmp_path_factory) -> dict:
    # A scratch folder of its own: the manifest is read without waiting for
    # a build that may hold .build's lock.
    scratch = tmp_path_factory.mktemp("scratch")
    out = subprocess.run([swift(), "package", "--scratch-path", str(scratch), "dump-package"],
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def dependencies(target: dict, platform: str) -> list[str]:
    """The names of the targets and products `target` depends on when built for `platform`."""
    names = []
    for dep in target["dependencies"]:
        # {"byName" | "target": [name, condition]}, {"product": [name, package, aliases, condition]}
        (value,) = dep.values()
        name, condition = value[0], value[-1]
        platforms = (condition or {}).get("platformNames")
        if platforms is None or platform in platforms:
            names.append(name)
    return names


def graph(manifest: dict, root: str, platform: str) -> dict[str, dict]:
    targets = {t["name"]: t for t in manifest["targets"]}
    seen: dict[str, dict] = {}
    stack = [root]
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        assert name in targets, f"{name} is not a target of this package (a package dependency?)"
        seen[name] = targets[name]
        stack.extend(dependencies(targets[name], platform))
    return seen


def client_roots(manifest: dict) -> list[str]:
    product, = [p for p in manifest["products"] if p["name"] == "HeraldClient"]
    return product["targets"]


def test_platforms_name_ios_and_macos(manifest):
    assert {p["platformName"] for p in manifest["platforms"]} >= set(APPLE)


@pytest.mark.parametrize("platform", APPLE)
def test_no_system_library_in_the_client_graph_on_apple_platforms(manifest, platform):
    for root in client_roots(manifest):
        reached = graph(manifest, root, platform)
        system = sorted(n for n, t in reached.items() if t["type"] == "system")
        assert not system, f"{platform}: HeraldClient reaches system libraries {system} through {sorted(reached)}"
        c_targets = sorted(n for n, t in reached.items() if (REPO_ROOT / "Sources" / n / "include").is_dir())
        assert not c_targets, f"{platform}: HeraldClient reaches C targets {c_targets}"


def test_the_linux_graph_still_has_libwebsockets_as_the_default_transport(manifest):
    reached = graph(manifest, "HeraldClient", "linux")
    assert {"HeraldClientLWS", "CLibWebSockets", "CSQLite"} <= set(reached)


IF = re.compile(r"^\s*#(if|elseif|else|endif)\b(.*)$")
IMPORT = re.compile(r"^\s*(?:@\w+\s+)*import\s+(?:(?:struct|class|enum|protocol|func|var|let|typealias)\s+)?(\w+)")


def guarded_imports(path: Path) -> list[tuple[int, str, list[str]]]:
    """Each import in `path` with the `#if` conditions it sits under."""
    found, stack = [], []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if m := IF.match(line):
            word, rest = m.group(1), m.group(2).strip()
            if word == "if":
                stack.append(rest)
            elif word == "endif":
                stack.pop()
            else:  # an #else or #elseif branch runs when the #if's condition does not hold
                stack[-1] = f"!({stack[-1]}) {rest}"
        elif m := IMPORT.match(line):
            found.append((n, m.group(1), list(stack)))
    return found


@pytest.mark.parametrize("platform", APPLE)
def test_linux_only_modules_are_imported_only_behind_can_import(manifest, platform):
    linux = graph(manifest, "HeraldClient", "linux")
    apple = graph(manifest, "HeraldClient", platform)
    linux_only = set(linux) - set(apple)
    assert linux_only, "the Linux graph should add the libwebsockets transport and SQLite"
    for name in apple:
        folder = REPO_ROOT / "Sources" / name
        for source in sorted(folder.rglob("*.swift")):
            for line, module, conditions in guarded_imports(source):
                if module in linux_only:
                    # Under a condition that needs the module, not in the #else of one.
                    needs = re.compile(rf"(?<!!\()canImport\({module}\)")
                    assert any(needs.search(c) for c in conditions), \
                        f"{source.relative_to(REPO_ROOT)}:{line} imports {module}, which {platform} builds do not have, outside `#if canImport({module})`"


def test_the_apple_graph_compiles(manifest, tmp_path):
    """Builds what an iOS app gets, here on Linux: the targets of the Apple
    graph alone, with a `SQLite3` module standing in for the SDK's. So the
    code behind `#if canImport(...)` that Apple builds take is compiled too,
    and nothing the Linux-only targets provide is used outside it."""
    apple = graph(manifest, "HeraldClient", "ios")
    sqlite = tmp_path / "Sources" / "SQLite3"
    sqlite.mkdir(parents=True)
    (sqlite / "module.modulemap").write_text('module SQLite3 [system] {\n header "shim.h"\n link "sqlite3"\n export *\n}\n')
    (sqlite / "shim.h").write_text("#include <sqlite3.h>\n")
    targets = ['.systemLibrary(name: "SQLite3")']
    for name, target in sorted(apple.items()):
        (tmp_path / "Sources" / name).symlink_to(REPO_ROOT / "Sources" / name)
        deps = dependencies(target, "ios") + (["SQLite3"] if name == "HeraldClient" else [])
        targets.append(f'.target(name: "{name}", dependencies: {json.dumps(deps)})')
    (tmp_path / "Package.swift").write_text(
        "// swift-tools-version:6.0\nimport PackageDescription\n"
        f'let package = Package(name: "AppleShape", targets: [{", ".join(targets)}], swiftLanguageModes: [.v6])\n')
    out = subprocess.run([swift(), "build", "--target", "HeraldClient"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
