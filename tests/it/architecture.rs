//! The shape of the code, checked: rooms (top-level modules of `src/`) import each other in one
//! direction only, and so do the modules of each room; `main.rs` only parses and dispatches;
//! records are read through their types, not by string paths, outside `record`; the library
//! never prints and never spells a command of the binary; no function in `src/` runs past 120
//! lines; every process a test spawns is killed and reaped when the test ends; and the docs stay
//! short and inside the repository.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Every source file of the crate, with its path below `src/`.
fn src_files() -> Vec<(String, PathBuf)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    files.into_iter().map(|f| (f.strip_prefix(&src).unwrap().to_string_lossy().into_owned(), f)).collect()
}

/// The code a build of the library compiles: comments and `#[cfg(test)]` tails dropped.
fn code(text: &str) -> String {
    let body = text.split("#[cfg(test)]").next().unwrap_or("");
    body.lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n")
}

/// room -> rooms it names as `crate::ROOM`.
fn imports(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    sources(src, &mut files);
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in files {
        let rel = f.strip_prefix(src).unwrap();
        let room = rel.iter().next().unwrap().to_string_lossy().trim_end_matches(".rs").to_string();
        if matches!(room.as_str(), "main" | "lib" | "cli") {
            continue;
        }
        let text = code(&std::fs::read_to_string(&f).unwrap());
        let deps = g.entry(room.clone()).or_default();
        for (i, _) in text.match_indices("crate::") {
            let name: String = text[i + 7..].chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            if !name.is_empty() && name != room {
                deps.insert(name);
            }
        }
    }
    g
}

/// A cycle of the graph, if it has one (depth-first search).
fn cycle(g: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(n: &str, g: &BTreeMap<String, BTreeSet<String>>, path: &mut Vec<String>, done: &mut BTreeSet<String>) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == n) {
            let mut c = path[i..].to_vec();
            c.push(n.to_string());
            return Some(c);
        }
        if done.contains(n) {
            return None;
        }
        path.push(n.to_string());
        for m in g.get(n).into_iter().flatten() {
            if let Some(c) = visit(m, g, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(n.to_string());
        None
    }
    let mut done = BTreeSet::new();
    g.keys().find_map(|n| visit(n, g, &mut Vec::new(), &mut done))
}

#[test]
fn the_cycle_finder_finds_cycles() {
    let g = |edges: &[(&str, &str)]| {
        let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (a, b) in edges {
            g.entry(a.to_string()).or_default().insert(b.to_string());
        }
        g
    };
    assert_eq!(cycle(&g(&[("a", "b"), ("b", "c")])), None);
    assert_eq!(cycle(&g(&[("a", "b"), ("b", "c"), ("c", "a")])), Some(vec!["a".into(), "b".into(), "c".into(), "a".into()]));
    assert!(cycle(&g(&[("x", "y"), ("a", "b"), ("b", "a")])).is_some());
}

#[test]
fn rooms_import_each_other_in_one_direction() {
    let g = imports(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    assert!(g.len() > 10, "rooms found: {:?}", g.keys());
    assert_eq!(cycle(&g), None, "module imports form a cycle");
}

/// The engine seam is typed: an expert source states itself as `plan::report`'s types, so
/// records read it without the engine or the service behind it, and nothing in the library
/// hands out a value to downcast.
#[test]
fn records_read_expert_sources_without_the_engine_and_nothing_is_downcast() {
    let g = imports(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    let record = &g["record"];
    assert!(!record.contains("engine") && !record.contains("service"), "record imports {record:?}");
    let downcast: Vec<String> = src_files()
        .into_iter()
        .filter(|(_, f)| {
            let c = code(&std::fs::read_to_string(f).unwrap());
            // A panic's payload is a `Box<dyn Any>` and is read by downcasting; a reference to
            // `Any` is a value handed out to be downcast.
            ["&mut dyn std::any::Any", "&dyn std::any::Any", "&mut dyn Any", "&dyn Any"].iter().any(|a| c.contains(a))
        })
        .map(|(rel, _)| rel)
        .collect();
    assert!(downcast.is_empty(), "files that hand out a value to downcast: {downcast:?}");
}

/// Where `code` starts this binary's command `command` by name (`.arg("device")`,
/// `.args(["device", "serve", ...])`), whitespace aside.
fn spells(code: &str, command: &str) -> bool {
    let code: String = code.split_whitespace().collect();
    code.contains(&format!(".arg(\"{command}\")")) || code.contains(&format!(".args([\"{command}\""))
}

/// The library starts this binary only through `cell::worker_command` (`cell SPEC`) and
/// `cell::task_command` (`task SPEC`), on a typed spec: no library code spells a command or its
/// flags, which only clap in `cli/` knows, so renaming a flag cannot break a caller at run time.
#[test]
fn the_library_never_spells_the_command_line() {
    let help = crate::common::ok(&["--help"]).stdout;
    let mut commands: Vec<String> = help
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect();
    assert!(["generate", "campaign", "device"].iter().all(|c| commands.iter().any(|x| x == c)), "{commands:?}");
    commands.extend(["cell".to_string(), "task".to_string()]);
    let mut found = Vec::new();
    for (rel, f) in src_files() {
        if rel == "main.rs" || rel.starts_with("cli/") {
            continue;
        }
        let text = code(&std::fs::read_to_string(&f).unwrap());
        for c in &commands {
            let entry = rel == "cell.rs" && (c == "cell" || c == "task");
            if spells(&text, c) && !entry {
                found.push(format!("{rel}: `{c}`"));
            }
        }
    }
    assert!(found.is_empty(), "library code that spells a command of this binary:\n{}", found.join("\n"));
    // The check can fail: the spelling this rule replaced is found, however it is wrapped.
    assert!(spells("cmd.args([\n    \"device\",\n    \"serve\", \"--listen\", &e])", "device"));
    assert!(spells("c.arg(\"task\").arg(spec)", "task") && !spells("c.arg(\"tasks\")", "task"));
}

/// The names a path names after `prefix` (`a` in `prefix::a::b`, each of `prefix::{a, b::c}`),
/// where the path starts there (`prefix` is not the tail of a longer path).
fn named_after(text: &str, prefix: &str) -> Vec<String> {
    let ident = |s: &str| -> String { s.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect() };
    let mut names = Vec::new();
    for (i, _) in text.match_indices(prefix) {
        let before = text[..i].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        let rest = &text[i + prefix.len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let (mut depth, mut item) = (0usize, String::new());
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        names.push(ident(item.trim()));
                        item.clear();
                        continue;
                    }
                    _ => {}
                }
                item.push(c);
            }
            names.push(ident(item.trim()));
        } else {
            names.push(ident(rest));
        }
    }
    names.retain(|n| !n.is_empty() && n != "self");
    names
}

/// Within room `dir`: module -> modules of the same room it uses. `mod.rs` is the node `mod`;
/// a name `mod.rs` re-exports (`pub use runner::X`) counts as its module's, and `mod.rs`'s
/// own declarations and re-exports are not uses.
fn room_imports(dir: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let room = dir.file_name().unwrap().to_string_lossy().into_owned();
    let mut texts: BTreeMap<String, String> = BTreeMap::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "rs") {
            texts.insert(p.file_stem().unwrap().to_string_lossy().into_owned(), code(&std::fs::read_to_string(&p).unwrap()));
        }
    }
    // mod.rs without its `mod` lines and re-exports; what each re-export names, by module.
    let mut exported: BTreeMap<String, String> = BTreeMap::new();
    let mut root = String::new();
    if let Some(text) = texts.get("mod") {
        for stmt in text.split_inclusive(';') {
            let t = stmt.trim_start();
            let t = t.strip_prefix("pub(crate) ").or_else(|| t.strip_prefix("pub ")).unwrap_or(t);
            if let Some(path) = t.strip_prefix("use ").filter(|_| stmt.trim_start().starts_with("pub")) {
                let module: String = path.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                for name in named_after(path, &format!("{module}::")) {
                    exported.insert(name, module.clone());
                }
            } else if !t.starts_with("mod ") {
                root.push_str(stmt);
            }
        }
    }
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (module, text) in &texts {
        let text = if module == "mod" { &root } else { text };
        let mut names = named_after(text, &format!("crate::{room}::"));
        if module == "mod" {
            names.extend(texts.keys().filter(|m| *m != "mod" && !named_after(text, &format!("{m}::")).is_empty()).cloned());
        } else {
            names.extend(named_after(text, "super::"));
        }
        let deps = g.entry(module.clone()).or_default();
        for name in names {
            let to = if texts.contains_key(&name) { name } else { exported.get(&name).cloned().unwrap_or_else(|| "mod".into()) };
            if &to != module {
                deps.insert(to);
            }
        }
    }
    g
}

#[test]
fn the_modules_of_a_room_import_each_other_in_one_direction() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut loops = Vec::new();
    let mut rooms = 0;
    for e in std::fs::read_dir(&src).unwrap() {
        let dir = e.unwrap().path();
        if dir.is_dir() {
            rooms += 1;
            // The room's root (`mod.rs`) is its face: it declares and re-exports its modules and
            // holds what they share, so it is left out; a name it re-exports stays its module's.
            let mut g = room_imports(&dir);
            g.remove("mod");
            g.values_mut().for_each(|deps| {
                deps.remove("mod");
            });
            if let Some(c) = cycle(&g) {
                loops.push(format!("{}: {}", dir.file_name().unwrap().to_string_lossy(), c.join(" -> ")));
            }
        }
    }
    assert!(rooms > 10, "{rooms} rooms");
    assert!(loops.is_empty(), "modules of a room import each other in a loop:\n{}", loops.join("\n"));
}

#[test]
fn room_imports_see_super_paths_groups_and_re_exports() {
    let dir = tempfile::tempdir().unwrap();
    let room = dir.path().join("r");
    std::fs::create_dir(&room).unwrap();
    let write = |f: &str, t: &str| std::fs::write(room.join(f), t).unwrap();
    write("mod.rs", "mod a;\nmod b;\nmod c;\npub use c::{Cee, other};\npub fn root() { a::f(); }\n");
    write("a.rs", "use super::{b::B, Cee};\nfn f() {}\n");
    write("b.rs", "pub struct B;\nfn g() { crate::r::root(); x::super::ignored(); }\n");
    write("c.rs", "pub struct Cee;\n#[cfg(test)]\nmod tests { use super::super::b::B; }\n");
    let g = room_imports(&room);
    let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    assert_eq!(g["a"], set(&["b", "c"]));
    assert_eq!(g["b"], set(&["mod"]));
    assert_eq!(g["c"], set(&[]));
    assert_eq!(g["mod"], set(&["a"]));
    assert_eq!(cycle(&g), Some(vec!["a".into(), "b".into(), "mod".into(), "a".into()]));
}

#[test]
fn main_only_parses_and_dispatches() {
    let main = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/main.rs")).unwrap();
    assert!(main.lines().count() <= 40, "src/main.rs has {} lines", main.lines().count());
    // Only the one-line error of a failed command is printed there.
    assert_eq!(
        main.matches("println!").count(),
        main.matches("eprintln!").count(),
        "src/main.rs prints: printing belongs to the command in src/cli/"
    );
}

#[test]
fn records_are_read_through_their_types_outside_record() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut found = Vec::new();
    for f in files.iter().filter(|f| !f.starts_with(src.join("record"))) {
        let text = code(&std::fs::read_to_string(f).unwrap());
        for needle in ["pointer(\"/", "[\"outcome\"]", "[\"experts\"]", "[\"counts\"]", "[\"resources\"]", "[\"surfaces\"]"] {
            if text.contains(needle) {
                found.push(format!("{}: {needle}", f.strip_prefix(&src).unwrap().display()));
            }
        }
    }
    assert!(found.is_empty(), "records read by string path: {found:?}");
}

/// The rooms as ARCHITECTURE.md's code map lists them, lowest first: one entry per `- ` line,
/// each naming its rooms in backticks before the dash.
fn documented_order(doc: &str) -> Vec<Vec<String>> {
    let start = doc.find("Library rooms (`src/`), lowest first").expect("the code map");
    let end = doc[start..].find("\nThe binary").map_or(doc.len(), |e| start + e);
    doc[start..end]
        .lines()
        .filter_map(|l| l.strip_prefix("- "))
        .map(|l| {
            let head = l.split(" — ").next().unwrap_or("");
            head.split('`').skip(1).step_by(2).map(str::to_string).collect()
        })
        .collect()
}

/// Each room imports only rooms its own entry or an earlier one names.
fn layering_errors(order: &[Vec<String>], g: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let level: BTreeMap<&str, usize> = order.iter().enumerate().flat_map(|(i, e)| e.iter().map(move |r| (r.as_str(), i))).collect();
    let mut errors = Vec::new();
    for (room, deps) in g {
        let Some(&at) = level.get(room.as_str()) else {
            errors.push(format!("room `{room}` is not in the code map"));
            continue;
        };
        for d in deps {
            match level.get(d.as_str()) {
                Some(&l) if l <= at => {}
                Some(_) => errors.push(format!("`{room}` imports `{d}`, which the code map lists after it")),
                None => errors.push(format!("`{room}` imports `{d}`, which is not in the code map")),
            }
        }
    }
    for r in level.keys() {
        if !g.contains_key(*r) {
            errors.push(format!("the code map lists `{r}`, which is not a room of src/"));
        }
    }
    errors
}

#[test]
fn the_code_map_lists_rooms_in_the_order_they_import_each_other() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
    let order = documented_order(&doc);
    assert!(order.len() > 15, "{order:?}");
    let g = imports(&root.join("src"));
    let errors = layering_errors(&order, &g);
    assert!(errors.is_empty(), "ARCHITECTURE.md's code map is not the import order:\n{}", errors.join("\n"));
    // The check can fail: a room listed below what imports it is reported.
    let mut swapped = order.clone();
    let (a, b) = (
        swapped.iter().position(|e| e.contains(&"source".to_string())).unwrap(),
        swapped.iter().position(|e| e.contains(&"plan".to_string())).unwrap(),
    );
    swapped.swap(a, b);
    assert!(
        layering_errors(&swapped, &g).iter().any(|e| e.contains("`plan` imports `source`, which the code map lists after it")),
        "{:?}",
        layering_errors(&swapped, &g)
    );
}

/// The library never prints and never sees the command line: its rooms report through `log`
/// (notices) and `campaign::Progress` (a runner's cells), which the binary shows, and flags
/// are clap's business in `cli/` alone.
#[test]
fn library_rooms_never_print() {
    let mut printing = Vec::new();
    for (rel, f) in src_files() {
        if rel == "main.rs" || rel.starts_with("cli/") {
            continue;
        }
        let text = code(&std::fs::read_to_string(&f).unwrap());
        for needle in ["println!", "print!(", "eprint!(", "indicatif::", "std::io::stdout", "std::io::stderr", "clap::", "ValueEnum"] {
            if text.contains(needle) {
                printing.push(format!("{rel}: {needle}"));
            }
        }
    }
    assert!(printing.is_empty(), "library rooms that print:\n{}", printing.join("\n"));
}

/// Each `fn` item's first and last line (1-based) in Rust source: braces counted outside
/// strings, characters and comments; a declaration without a body (`;` first) is none.
fn function_spans(text: &str) -> Vec<(String, usize, usize)> {
    let c: Vec<char> = text.chars().collect();
    let (mut i, mut line, mut depth) = (0, 1, 0usize);
    let mut pending: Option<(String, usize)> = None;
    let mut open: Vec<(String, usize, usize)> = Vec::new();
    let mut spans = Vec::new();
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    while i < c.len() {
        let ch = c[i];
        let next = c.get(i + 1).copied().unwrap_or(' ');
        match ch {
            '\n' => line += 1,
            '/' if next == '/' => {
                while i < c.len() && c[i] != '\n' {
                    i += 1;
                }
                continue;
            }
            '/' if next == '*' => {
                while i + 1 < c.len() && !(c[i] == '*' && c[i + 1] == '/') {
                    line += usize::from(c[i] == '\n');
                    i += 1;
                }
                i += 2;
                continue;
            }
            'r' if (next == '"' || next == '#') && !(i > 0 && ident(c[i - 1])) => {
                let hashes = c[i + 1..].iter().take_while(|&&x| x == '#').count();
                if c.get(i + 1 + hashes) == Some(&'"') {
                    let close: String = std::iter::once('"').chain(std::iter::repeat_n('#', hashes)).collect();
                    let rest: String = c[i + 2 + hashes..].iter().collect();
                    let end = rest.find(&close).expect("a raw string ends");
                    line += rest[..end].matches('\n').count();
                    i += 2 + hashes + rest[..end].chars().count() + close.len();
                    continue;
                }
            }
            '"' => {
                i += 1;
                while i < c.len() && c[i] != '"' {
                    line += usize::from(c[i] == '\n');
                    i += if c[i] == '\\' { 2 } else { 1 };
                }
            }
            '\'' if next == '\\' || c.get(i + 2) == Some(&'\'') => {
                i += 1;
                while i < c.len() && c[i] != '\'' {
                    i += if c[i] == '\\' { 2 } else { 1 };
                }
            }
            'f' if next == 'n' && c.get(i + 2).is_some_and(|x| x.is_whitespace()) && !(i > 0 && ident(c[i - 1])) => {
                let name: String = c[i + 3..].iter().skip_while(|x| x.is_whitespace()).take_while(|&&x| ident(x)).collect();
                pending = Some((name, line));
            }
            ';' if pending.is_some() && open.last().is_none_or(|o| o.2 < depth) => pending = None,
            '{' => {
                if let Some((name, start)) = pending.take() {
                    open.push((name, start, depth));
                }
                depth += 1;
            }
            '}' => {
                depth = depth.saturating_sub(1);
                if open.last().is_some_and(|o| o.2 == depth) {
                    let (name, start, _) = open.pop().expect("open");
                    spans.push((name, start, line));
                }
            }
            _ => {}
        }
        i += 1;
    }
    spans
}

#[test]
fn function_spans_skip_strings_and_declarations() {
    let text = "trait T { fn d(&self); }\nfn a() {\n    let s = \"}{\";\n    let c = '}';\n    let r = r#\"{\"#;\n}\n// fn x() {\nfn b<'a>(x: &'a str) { }\n";
    let spans = function_spans(text);
    assert_eq!(spans, [("a".to_string(), 2, 6), ("b".to_string(), 8, 8)]);
}

/// A function a reader can hold in view: none in `src/` runs past 120 lines.
#[test]
fn no_function_is_longer_than_120_lines() {
    let mut long = Vec::new();
    for (rel, f) in src_files() {
        for (name, start, end) in function_spans(&std::fs::read_to_string(&f).unwrap()) {
            if end - start + 1 > 120 {
                long.push(format!("{rel}:{start}: fn {name} has {} lines", end - start + 1));
            }
        }
    }
    assert!(long.is_empty(), "functions longer than 120 lines:\n{}", long.join("\n"));
}

/// `text` with the insides of comments, strings and character literals blanked (same length,
/// same lines), so what is left is code.
fn blank_literals(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = c.clone();
    let blank = |from: usize, to: usize, out: &mut Vec<char>| {
        for x in &mut out[from..to.min(c.len())] {
            if *x != '\n' {
                *x = ' ';
            }
        }
    };
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    let mut i = 0;
    while i < c.len() {
        let next = c.get(i + 1).copied().unwrap_or(' ');
        let start = i;
        match c[i] {
            '/' if next == '/' => {
                while i < c.len() && c[i] != '\n' {
                    i += 1;
                }
                blank(start, i, &mut out);
                continue;
            }
            '/' if next == '*' => {
                while i + 1 < c.len() && !(c[i] == '*' && c[i + 1] == '/') {
                    i += 1;
                }
                i += 2;
                blank(start, i, &mut out);
                continue;
            }
            'r' if (next == '"' || next == '#') && !(i > 0 && ident(c[i - 1])) => {
                let hashes = c[i + 1..].iter().take_while(|&&x| x == '#').count();
                if c.get(i + 1 + hashes) == Some(&'"') {
                    let close: String = std::iter::once('"').chain(std::iter::repeat_n('#', hashes)).collect();
                    let rest: String = c[i + 2 + hashes..].iter().collect();
                    let end = rest.find(&close).expect("a raw string ends");
                    i += 2 + hashes + rest[..end].chars().count() + close.chars().count();
                    blank(start + 2 + hashes, i - close.chars().count(), &mut out);
                    continue;
                }
            }
            '"' => {
                i += 1;
                while i < c.len() && c[i] != '"' {
                    i += if c[i] == '\\' { 2 } else { 1 };
                }
                blank(start + 1, i, &mut out);
            }
            '\'' if next == '\\' || c.get(i + 2) == Some(&'\'') => {
                i += 1;
                while i < c.len() && c[i] != '\'' {
                    i += if c[i] == '\\' { 2 } else { 1 };
                }
                blank(start + 1, i, &mut out);
            }
            _ => {}
        }
        i += 1;
    }
    out.into_iter().collect()
}

/// Each `.spawn()` (a process; a thread's spawn takes a closure) in `code` that is not an
/// argument of `Reaped::new(...)`, by line.
fn unreaped_spawns(code: &str) -> Vec<usize> {
    let b = code.as_bytes();
    let guarded: Vec<(usize, usize)> = code
        .match_indices("Reaped::new(")
        .map(|(at, m)| {
            let (mut end, mut depth) = (at + m.len(), 1);
            while depth > 0 && end < b.len() {
                depth += usize::from(b[end] == b'(');
                depth -= usize::from(b[end] == b')');
                end += 1;
            }
            (at, end)
        })
        .collect();
    code.match_indices(".spawn()")
        .filter(|(at, _)| !guarded.iter().any(|(from, to)| from < at && at < to))
        .map(|(at, _)| code[..at].matches('\n').count() + 1)
        .collect()
}

#[test]
fn unreaped_spawns_are_found_outside_strings_and_comments() {
    let text = "let a = Reaped::new(bin().args([\")\"]).spawn().unwrap());\n// x.spawn()\nlet b = cmd.spawn();\nlet s = \".spawn()\";\nthread::spawn(|| ());\n";
    assert_eq!(unreaped_spawns(&blank_literals(text)), [3]);
}

/// No test leaves a process running: each process a test spawns is held by `common::Reaped`,
/// which kills and reaps it when dropped, on every path out of the test, panics included.
/// (Processes run to their end by `.output()` or `.status()` are waited for where they start.)
#[test]
fn every_process_a_test_spawns_is_reaped() {
    let tests = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let mut files = Vec::new();
    sources(&tests, &mut files);
    let mut loose = Vec::new();
    for f in files {
        let code = blank_literals(&std::fs::read_to_string(&f).unwrap());
        for line in unreaped_spawns(&code) {
            loose.push(format!("{}:{line}", f.strip_prefix(&tests).unwrap().display()));
        }
    }
    assert!(loose.is_empty(), "processes spawned without common::Reaped (killed and reaped when dropped):\n{}", loose.join("\n"));
}

/// A newcomer's docs: the README's tour stays short (details have their own sections, dated
/// figures live in BENCHMARKS.md), and nothing the repository ships points outside it.
#[test]
fn the_docs_stay_short_and_inside_the_repository() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let tour = readme.split("\n## A short tour\n").nth(1).expect("the README's tour");
    let tour_lines = tour.split("\n## ").next().unwrap().lines().count();
    assert!(tour_lines < 60, "the README's tour has {tour_lines} lines");
    assert!(root.join("BENCHMARKS.md").is_file());
    let mut outside = Vec::new();
    let mut files: Vec<PathBuf> = ["README.md", "ARCHITECTURE.md", "BENCHMARKS.md", "Makefile"].iter().map(|f| root.join(f)).collect();
    for dir in ["src", "tests", "scripts", "campaigns"] {
        files.extend(std::fs::read_dir(root.join(dir)).unwrap().map(|e| e.unwrap().path()).filter(|p| p.is_file()));
    }
    sources(&root.join("src"), &mut files);
    sources(&root.join("tests"), &mut files);
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap_or_default();
        if text.contains(concat!("../", "shared/")) {
            outside.push(f.strip_prefix(root).unwrap().display().to_string());
        }
    }
    outside.sort();
    outside.dedup();
    assert!(outside.is_empty(), "files that point outside the repository: {outside:?}");
}
