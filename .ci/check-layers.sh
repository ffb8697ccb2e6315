#!/usr/bin/env bash
# Fails when the modules of one crate import each other in a circle.
#
# Reads every crate's `src/` (the library and its modules; `main.rs` and
# `src/bin/` are other crates), follows `use crate::…`, `super::…`,
# `self::…` and inline `crate::…` paths outside `#[cfg(test)]` items, maps
# each path to the module file that defines it, and prints every strongly
# connected set of modules with the lines that tie them together.
# Tests may reach across layers; the code they test may not.
#
# Usage: .ci/check-layers.sh [crate-dir…]   (default: every workspace crate)
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 - "$@" <<'PY'
import os, re, sys

def crates(args):
    if args:
        return args
    return sorted(d for d in os.listdir('.')
                  if os.path.isfile(os.path.join(d, 'Cargo.toml'))
                  and os.path.isfile(os.path.join(d, 'src', 'lib.rs')))

def module_of(rel):
    """src-relative file path -> module path tuple."""
    parts = rel[:-3].split(os.sep)
    if parts[-1] in ('lib', 'mod'):
        parts = parts[:-1]
    return tuple(parts)

def strip(text):
    """Blanks comments, string and char literals, keeping line numbers."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith('//', i):
            j = text.find('\n', i)
            j = n if j < 0 else j
            out.append(' ' * (j - i)); i = j
        elif text.startswith('/*', i):
            j = text.find('*/', i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r'[^\n]', ' ', text[i:j])); i = j
        elif c == 'r' and re.match(r'r#*"', text[i:i + 10]) and not (i and (text[i-1].isalnum() or text[i-1] == '_')):
            hashes = re.match(r'r(#*)"', text[i:]).group(1)
            end = '"' + hashes
            j = text.find(end, i + 2 + len(hashes))
            j = n if j < 0 else j + len(end)
            out.append(re.sub(r'[^\n]', ' ', text[i:j])); i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == '\\' else 1
            j = min(j + 1, n)
            out.append(re.sub(r'[^\n]', ' ', text[i:j])); i = j
        elif c == "'" and re.match(r"'(\\.|[^\\'])'", text[i:i + 4]) or text.startswith("'\\", i):
            m = re.match(r"'(\\[^']*|[^\\'])'", text[i:])
            j = i + (m.end() if m else 1)
            out.append(' ' * (j - i)); i = j
        else:
            out.append(c); i += 1
    return ''.join(out)

def drop_test_items(text):
    """Blanks every item under `#[cfg(test)]` (a module, fn or impl)."""
    out = list(text)
    for m in re.finditer(r'#\[cfg\(test\)\]', text):
        i = m.end()
        depth = 0
        while i < len(text):
            if text[i] == '{':
                depth += 1
            elif text[i] == '}':
                depth -= 1
                if depth == 0:
                    i += 1
                    break
            elif text[i] == ';' and depth == 0:
                i += 1
                break
            i += 1
        for k in range(m.start(), i):
            if out[k] != '\n':
                out[k] = ' '
    return ''.join(out)

def expand(tree):
    """`a::{b, c::{d, e}}` -> [a::b, a::c::d, a::c::e]."""
    tree = re.sub(r'\s+', '', tree)
    i = tree.find('{')
    if i < 0:
        return [re.sub(r'\bas\w+$', '', tree)]
    prefix, inner = tree[:i], tree[i + 1:tree.rfind('}')]
    parts, depth, cur = [], 0, ''
    for ch in inner:
        if ch == ',' and depth == 0:
            parts.append(cur); cur = ''
            continue
        depth += ch == '{'
        depth -= ch == '}'
        cur += ch
    parts.append(cur)
    return [p for part in parts if part for p in expand(prefix + part)]

def check(crate):
    src = os.path.join(crate, 'src')
    files = {}
    for root, dirs, names in os.walk(src):
        dirs[:] = [d for d in dirs if not (root == src and d == 'bin')]
        for name in names:
            rel = os.path.relpath(os.path.join(root, name), src)
            if name.endswith('.rs') and rel != 'main.rs':
                files[module_of(rel)] = os.path.join(root, name)
    edges = {}
    for mod, path in files.items():
        raw = open(path, encoding='utf-8').read()
        text = drop_test_items(strip(raw))
        lines = raw.splitlines()
        children = {m[len(mod)] for m in files if len(m) == len(mod) + 1 and m[:len(mod)] == mod}
        refs = []
        def add(p, pos):
            refs.append((p, text.count('\n', 0, pos) + 1))
        for m in re.finditer(r'\buse\s+([^;]*);', text):
            for p in expand(m.group(1)):
                add(p, m.start())
        rest = re.sub(r'\buse\s+[^;]*;', lambda m: re.sub(r'[^\n]', ' ', m.group(0)), text)
        for m in re.finditer(r'(?<![\w:])((?:crate|super|self)(?:\s*::\s*\w+)+)', rest):
            add(re.sub(r'\s+', '', m.group(1)), m.start())
        for p, line in refs:
            segs = [s for s in p.split('::') if s]
            if not segs:
                continue
            if segs[0] == 'crate':
                base, segs = (), segs[1:]
            elif segs[0] in ('super', 'self'):
                base = mod
                while segs and segs[0] in ('super', 'self'):
                    base = base[:-1] if segs[0] == 'super' else base
                    segs = segs[1:]
            elif segs[0] in children:
                base = mod
            else:
                continue  # another crate or the prelude
            target = base
            for s in segs:
                if target + (s,) in files:
                    target = target + (s,)
                else:
                    break
            if target != mod and target in files:
                edges.setdefault(mod, {}).setdefault(target, []).append(
                    f'{path}:{line}: {lines[line - 1].strip()}')
    # Tarjan's strongly connected components.
    index, low, stack, on, sccs, counter = {}, {}, [], set(), [], [0]
    def visit(v):
        index[v] = low[v] = counter[0]; counter[0] += 1
        stack.append(v); on.add(v)
        for w in edges.get(v, {}):
            if w not in index:
                visit(w); low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop(); on.discard(w); comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                sccs.append(comp)
    sys.setrecursionlimit(10000)
    for v in sorted(files):
        if v not in index:
            visit(v)
    name = lambda m: '::'.join(('crate',) + m)
    for comp in sccs:
        members = set(comp)
        print(f'{crate}: import cycle among ' + ', '.join(sorted(name(m) for m in comp)))
        for a in sorted(comp):
            for b, where in sorted(edges.get(a, {}).items()):
                if b in members:
                    print(f'  {name(a)} -> {name(b)}')
                    for w in where[:3]:
                        print(f'      {w}')
    return len(sccs), len(files), sum(len(t) for t in edges.values())

failed = 0
for crate in crates(sys.argv[1:]):
    cycles, mods, n = check(crate)
    failed += cycles
    if not cycles:
        print(f'{crate}: {mods} modules, {n} module imports, no cycle')
sys.exit(1 if failed else 0)
PY
