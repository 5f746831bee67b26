//! The modules of one crate and who imports whom, read from the sources: enough of Rust's
//! paths to find import circles between files.
//!
//! A module's edges are the `crate::`, `super::` and `self::` paths of its `use` statements
//! and of its code, each resolved to the file that defines the item (following `pub use`
//! re-exports). A path into a module's own submodules is not an edge (a parent declares,
//! lists and re-exports its children); a `pub use` of anything else is. Test modules
//! (`#[cfg(test)]` to the end of a file) are left out. Why by hand: no crate reads a crate's
//! module graph without compiling it (`cargo-modules` needs rust-analyzer), and this test
//! must stay a fast source check.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module path from the crate root (`["context", "strategy", "usp"]`).
type ModPath = Vec<String>;

/// The crate under `src`: each module's file and what it imports.
pub struct ModuleGraph {
    files: BTreeMap<ModPath, PathBuf>,
    /// Each module's `pub use` re-exports: name -> the full path it re-exports.
    reexports: BTreeMap<ModPath, BTreeMap<String, ModPath>>,
    /// Each module's import paths (full, from the crate root).
    imports: BTreeMap<ModPath, Vec<ModPath>>,
}

impl ModuleGraph {
    pub fn read(src: &Path) -> ModuleGraph {
        let mut files = BTreeMap::new();
        collect_files(src, src, &mut files);
        let mut graph = ModuleGraph {
            files,
            reexports: BTreeMap::new(),
            imports: BTreeMap::new(),
        };
        let modules: Vec<ModPath> = graph.files.keys().cloned().collect();
        for module in modules {
            let text = std::fs::read_to_string(&graph.files[&module]).unwrap();
            let code = code_of(&text);
            let (reexports, imports) = paths_of(&code, &module, &graph.files);
            graph.reexports.insert(module.clone(), reexports);
            graph.imports.insert(module, imports);
        }
        graph
    }

    /// The module that defines the item `path` names (or the module it names).
    fn resolve(&self, path: &[String], depth: usize) -> Option<ModPath> {
        let mut module: ModPath = Vec::new();
        let mut rest = path;
        while let Some((first, tail)) = rest.split_first() {
            let mut next = module.clone();
            next.push(first.clone());
            if !self.files.contains_key(&next) {
                break;
            }
            module = next;
            rest = tail;
        }
        if let (Some(name), true) = (rest.first(), depth < 8) {
            if let Some(target) = self.reexports.get(&module).and_then(|r| r.get(name)) {
                let mut full = target.clone();
                full.extend(rest[1..].iter().cloned());
                return self.resolve(&full, depth + 1).or(Some(module));
            }
        }
        Some(module)
    }

    /// Who imports whom: module -> the modules it needs (itself, its own submodules and
    /// modules of other crates left out).
    pub fn edges(&self) -> BTreeMap<ModPath, BTreeSet<ModPath>> {
        let mut edges = BTreeMap::new();
        for (module, imports) in &self.imports {
            let targets: BTreeSet<ModPath> = imports
                .iter()
                .filter_map(|p| self.resolve(p, 0))
                .filter(|t| !t.starts_with(module))
                .collect();
            edges.insert(module.clone(), targets);
        }
        edges
    }

    /// The import circles: every group of two or more modules that reach each other, each
    /// as its files relative to `root`, sorted; then the same among the submodules of each
    /// folder with every module inside a submodule counted as that submodule (so `mosaic/`
    /// and `rules/` of one crate may not import each other through any of their files),
    /// each as its files or folders (`dsl/src/mosaic/`).
    pub fn circles(&self, root: &Path) -> Vec<Vec<String>> {
        let edges = self.edges();
        let mut circles: BTreeSet<Vec<String>> = groups(&edges)
            .into_iter()
            .map(|g| g.iter().map(|m| self.file(m, root)).collect())
            .collect();
        for folder in self.files.keys() {
            let depth = folder.len() + 1;
            let inside = |m: &ModPath| m.len() >= depth && m.starts_with(folder);
            let mut collapsed: BTreeMap<ModPath, BTreeSet<ModPath>> = BTreeMap::new();
            for (from, targets) in &edges {
                if !inside(from) {
                    continue;
                }
                let from = from[..depth].to_vec();
                let entry = collapsed.entry(from.clone()).or_default();
                for to in targets.iter().filter(|t| inside(t)) {
                    if to[..depth] != from[..] {
                        entry.insert(to[..depth].to_vec());
                    }
                }
            }
            for group in groups(&collapsed) {
                circles.insert(group.iter().map(|m| self.folder_or_file(m, root)).collect());
            }
        }
        circles.into_iter().collect()
    }

    /// A module's folder (`dsl/src/mosaic/`) if it has submodules, else its file.
    fn folder_or_file(&self, module: &ModPath, root: &Path) -> String {
        let has_children = self
            .files
            .keys()
            .any(|m| m.len() > module.len() && m.starts_with(module));
        let file = self.file(module, root);
        match (has_children, file.rsplit_once('/')) {
            (true, Some((folder, _))) => format!("{folder}/"),
            _ => file,
        }
    }

    fn file(&self, module: &ModPath, root: &Path) -> String {
        let file = &self.files[module];
        file.strip_prefix(root)
            .unwrap_or(file)
            .display()
            .to_string()
    }
}

/// The groups of two or more nodes of `edges` that reach each other, each sorted.
fn groups(edges: &BTreeMap<ModPath, BTreeSet<ModPath>>) -> BTreeSet<Vec<ModPath>> {
    let reach = |from: &ModPath| {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.clone()];
        while let Some(m) = stack.pop() {
            for next in edges.get(&m).into_iter().flatten() {
                if seen.insert(next.clone()) {
                    stack.push(next.clone());
                }
            }
        }
        seen
    };
    let reached: BTreeMap<&ModPath, BTreeSet<ModPath>> =
        edges.keys().map(|m| (m, reach(m))).collect();
    let mut out = BTreeSet::new();
    for (m, from_m) in &reached {
        if from_m.contains(*m) {
            let group: Vec<ModPath> = from_m
                .iter()
                .filter(|other| reached.get(other).is_some_and(|r| r.contains(*m)))
                .cloned()
                .collect();
            out.insert(group);
        }
    }
    out
}

/// Every `.rs` file under `dir` as its module path.
fn collect_files(src: &Path, dir: &Path, out: &mut BTreeMap<ModPath, PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            collect_files(src, &path, out);
            continue;
        }
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let rel = path.strip_prefix(src).unwrap().with_extension("");
        let mut module: ModPath = rel
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        if matches!(
            module.last().map(String::as_str),
            Some("mod" | "lib" | "main")
        ) {
            module.pop();
        }
        out.insert(module, path);
    }
}

/// The code of a file: comments and string literals blanked, test modules cut off.
fn code_of(text: &str) -> String {
    let text = text.split("#[cfg(test)]").next().unwrap_or_default();
    let mut code = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    let mut in_string = false;
    while let Some(c) = chars.next() {
        if in_string {
            match c {
                '\\' => {
                    chars.next();
                }
                '"' => {
                    in_string = false;
                    code.push('"');
                }
                '\n' => code.push('\n'),
                _ => {}
            }
        } else if c == '"' {
            in_string = true;
            code.push('"');
        } else if c == '/' && chars.peek() == Some(&'/') {
            for c in chars.by_ref() {
                if c == '\n' {
                    code.push('\n');
                    break;
                }
            }
        } else {
            code.push(c);
        }
    }
    code
}

/// A path's first segment resolved against `module`: `crate`, `super` (repeated), `self`, or
/// one of the module's own submodules (`use config::X` in a parent); `None` for another
/// crate's path.
fn absolute(
    segments: &[String],
    module: &ModPath,
    files: &BTreeMap<ModPath, PathBuf>,
) -> Option<ModPath> {
    let first = segments.first()?;
    let mut base = match first.as_str() {
        "crate" => Vec::new(),
        "self" => module.clone(),
        "super" => module.clone(),
        _ => {
            let mut child = module.clone();
            child.push(first.clone());
            if !files.contains_key(&child) {
                return None;
            }
            let mut full = module.clone();
            full.extend(segments.iter().cloned());
            return Some(full);
        }
    };
    let mut rest = &segments[1..];
    if segments[0] == "super" {
        base.pop()?;
        while rest.first().is_some_and(|s| s == "super") {
            base.pop()?;
            rest = &rest[1..];
        }
    }
    base.extend(rest.iter().filter(|s| *s != "self").cloned());
    Some(base)
}

/// The `pub use` re-exports (name -> full path) and the imports (full paths) of a module's
/// code.
fn paths_of(
    code: &str,
    module: &ModPath,
    files: &BTreeMap<ModPath, PathBuf>,
) -> (BTreeMap<String, ModPath>, Vec<ModPath>) {
    let mut reexports = BTreeMap::new();
    let mut imports = Vec::new();
    let mut rest = code;
    let mut outside_use = String::new();
    while let Some(at) = find_use(rest) {
        outside_use.push_str(&rest[..at.start]);
        let statement = &rest[at.body..at.end];
        for (path, alias) in expand_use_tree(statement) {
            let Some(full) = absolute(&path, module, files) else {
                continue;
            };
            if at.public {
                // A re-export of anything but the module's own submodules' items is a need
                // too: the module's surface depends on it.
                if !full.starts_with(module) {
                    imports.push(full.clone());
                }
                reexports.insert(alias, full);
            } else {
                imports.push(full);
            }
        }
        rest = &rest[at.end..];
    }
    outside_use.push_str(rest);
    // Paths written in the code itself (`crate::context::config::chunk_of(..)`).
    for start in ["crate::", "super::", "self::"] {
        for (i, _) in outside_use.match_indices(start) {
            let before = outside_use[..i].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            let path: Vec<String> = outside_use[i..]
                .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .next()
                .unwrap_or_default()
                .split("::")
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect();
            if let Some(full) = absolute(&path, module, files) {
                imports.push(full);
            }
        }
    }
    (reexports, imports)
}

/// One `use` statement: where it starts, where its tree starts and ends, and whether it is
/// a re-export (`pub use`, `pub(crate) use`, ...).
struct UseAt {
    start: usize,
    body: usize,
    end: usize,
    public: bool,
}

fn find_use(code: &str) -> Option<UseAt> {
    let mut from = 0;
    while let Some(i) = code[from..].find("use ") {
        let at = from + i;
        let line_start = code[..at].rfind('\n').map_or(0, |n| n + 1);
        let prefix = code[line_start..at].trim();
        let public = prefix.starts_with("pub");
        if prefix.is_empty() || prefix.starts_with("pub") {
            let end = at + code[at..].find(';')? + 1;
            return Some(UseAt {
                start: line_start,
                body: at + 4,
                end,
                public,
            });
        }
        from = at + 4;
    }
    None
}

/// `a::b::{c, d::{e as f}, self}` -> `[(a::b::c, c), (a::b::d::e, f), (a::b, b)]`.
fn expand_use_tree(tree: &str) -> Vec<(Vec<String>, String)> {
    let tree: String = tree
        .chars()
        .filter(|c| !c.is_whitespace() || *c == ' ')
        .collect();
    let tree = tree.trim().trim_end_matches(';').trim();
    let mut out = Vec::new();
    expand(tree, &[], &mut out);
    out
}

fn expand(tree: &str, prefix: &[String], out: &mut Vec<(Vec<String>, String)>) {
    let tree = tree.trim();
    if tree.is_empty() {
        return;
    }
    if let Some(open) = tree.find('{') {
        let head: Vec<String> = tree[..open]
            .split("::")
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect();
        let mut base = prefix.to_vec();
        base.extend(head);
        let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
        let mut depth = 0;
        let mut start = 0;
        for (i, c) in inner.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    expand(&inner[start..i], &base, out);
                    start = i + 1;
                }
                _ => {}
            }
        }
        expand(&inner[start..], &base, out);
        return;
    }
    let (path, alias) = match tree.split_once(" as ") {
        Some((p, a)) => (p.trim(), Some(a.trim().to_string())),
        None => (tree, None),
    };
    let mut full = prefix.to_vec();
    full.extend(
        path.split("::")
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string),
    );
    if full.last().is_some_and(|s| s == "self") {
        full.pop();
    }
    if full.last().is_some_and(|s| s == "*") {
        full.pop();
        out.push((full, "*".to_string()));
        return;
    }
    let alias = alias.unwrap_or_else(|| full.last().cloned().unwrap_or_default());
    out.push((full, alias));
}

#[test]
fn use_trees_expand_to_paths() {
    let paths: Vec<String> = expand_use_tree("super::{a::{B, C as D}, self, e::*}")
        .into_iter()
        .map(|(p, alias)| format!("{}={alias}", p.join("::")))
        .collect();
    assert_eq!(
        paths,
        [
            "super::a::B=B",
            "super::a::C=D",
            "super=super",
            "super::e=*"
        ]
    );
}

/// The graph sees through re-exports: a strategy's file imports the typed op through
/// `local_splash`'s facade and the contract through `strategy`'s.
#[test]
fn imports_resolve_to_the_defining_file() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("parallel/src");
    let edges = ModuleGraph::read(&src).edges();
    let path = |p: &str| p.split('/').map(str::to_string).collect::<ModPath>();
    let ulysses = &edges[&path("context/strategy/ulysses")];
    for needed in [
        "context/local_splash/heads",
        "context/config/contract",
        "context/layout",
    ] {
        assert!(ulysses.contains(&path(needed)), "{needed}: {ulysses:?}");
    }
    // A parent's paths into its own submodules are not edges.
    assert!(!edges[&path("context/config")].contains(&path("context/config/contract")));
}
