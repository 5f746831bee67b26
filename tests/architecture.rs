//! The dependency rules of docs/architecture.md, checked on the crate manifests: each crate
//! depends on exactly the tessera crates it is allowed to, and the facade library carries no
//! CLI dependency (clap and anyhow only behind the `cli` feature, for the binary); the README
//! stays an entrance and the docs links resolve; errors are typed, not strings.

#[path = "architecture/modules.rs"]
mod modules;

use std::collections::BTreeSet;
use std::path::Path;

use modules::ModuleGraph;

/// Every workspace crate, its folder, and the tessera crates it may depend on (normal
/// dependencies; tests may use more).
const ALLOWED: &[(&str, &str, &[&str])] = &[
    ("tessera-array", "array", &[]),
    ("tessera-macros", "macros", &[]),
    ("tessera-hlo", "hlo", &["tessera-array"]),
    ("tessera-runtime", "runtime", &["tessera-array"]),
    (
        "tessera-dsl",
        "dsl",
        &["tessera-array", "tessera-hlo", "tessera-macros"],
    ),
    // Where a kernel runs (the interpreter or a PJRT platform): below every kernel family.
    (
        "tessera-backend",
        "backend",
        &[
            "tessera-array",
            "tessera-dsl",
            "tessera-hlo",
            "tessera-runtime",
        ],
    ),
    // The registry's machinery: below every kernel family, so each registers itself.
    (
        "tessera-registry",
        "kernels/registry",
        &["tessera-dsl", "tessera-hlo", "tessera-backend"],
    ),
    (
        "tessera-splash",
        "kernels/splash",
        &[
            "tessera-array",
            "tessera-dsl",
            "tessera-hlo",
            "tessera-backend",
            "tessera-registry",
        ],
    ),
    (
        "tessera-paged",
        "kernels/paged",
        &["tessera-dsl", "tessera-hlo", "tessera-registry"],
    ),
    (
        "tessera-collective-kernels",
        "kernels/collective",
        &["tessera-dsl", "tessera-hlo", "tessera-registry"],
    ),
    (
        "tessera-collectives",
        "collectives",
        &["tessera-array", "tessera-hlo", "tessera-runtime"],
    ),
    // A kernel author's own crate: the facade as a library, nothing below it.
    ("rmsnorm", "examples/rmsnorm", &["tessera"]),
    // Test-only (a dev-dependency of the facade): reads Mosaic text, never the kernel IR.
    ("tessera-mosaic-eval", "mosaic-eval", &["tessera-array"]),
    (
        "tessera-parallel",
        "parallel",
        &[
            "tessera-array",
            "tessera-dsl",
            "tessera-hlo",
            "tessera-backend",
            "tessera-splash",
            "tessera-collective-kernels",
            "tessera-collectives",
            "tessera-runtime",
        ],
    ),
    (
        "tessera-train",
        "train",
        &[
            "tessera-array",
            "tessera-dsl",
            "tessera-hlo",
            "tessera-splash",
            "tessera-collective-kernels",
            "tessera-collectives",
            "tessera-parallel",
            "tessera-runtime",
        ],
    ),
    // The Python extension of the tessera-jax package: the facade's library, nothing else.
    ("tessera-jax", "python", &["tessera"]),
];

fn manifest(dir: &str) -> toml::Table {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(dir)
        .join("Cargo.toml");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    text.parse()
        .unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()))
}

fn tessera_deps(m: &toml::Table, section: &str) -> BTreeSet<String> {
    m.get(section)
        .and_then(|d| d.as_table())
        .map(|d| {
            d.keys()
                .filter(|k| k.starts_with("tessera"))
                .cloned()
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn every_crate_depends_only_on_what_the_architecture_allows() {
    let workspace = manifest(".");
    let members: BTreeSet<String> = workspace["workspace"]["members"]
        .as_array()
        .expect("workspace members")
        .iter()
        .map(|m| m.as_str().expect("a member path").to_string())
        .collect();
    let listed: BTreeSet<String> = ALLOWED.iter().map(|(_, dir, _)| dir.to_string()).collect();
    assert_eq!(
        members, listed,
        "the workspace members and the crates of docs/architecture.md differ; add the new \
         crate to ALLOWED here and to the document"
    );
    for (name, dir, allowed) in ALLOWED {
        let m = manifest(dir);
        assert_eq!(m["package"]["name"].as_str(), Some(*name), "{dir}");
        let deps = tessera_deps(&m, "dependencies");
        let allowed: BTreeSet<String> = allowed.iter().map(|s| s.to_string()).collect();
        let extra: Vec<_> = deps.difference(&allowed).collect();
        assert!(
            extra.is_empty(),
            "{name} depends on {extra:?}, which docs/architecture.md does not allow"
        );
    }
}

#[test]
fn the_python_package_uses_the_library_without_the_cli() {
    let m = manifest("python");
    let tessera = &m["dependencies"]["tessera"];
    assert_eq!(
        tessera.get("default-features").and_then(|d| d.as_bool()),
        Some(false),
        "tessera-jax must depend on the tessera library without its default `cli` feature"
    );
    assert!(
        tessera.get("features").is_none(),
        "tessera-jax must not enable facade features (the CLI's dependencies)"
    );
}

#[test]
fn the_library_has_no_cli_dependencies() {
    let m = manifest(".");
    for dep in ["clap", "anyhow"] {
        let spec = &m["dependencies"][dep];
        assert_eq!(
            spec.get("optional").and_then(|o| o.as_bool()),
            Some(true),
            "{dep} must be optional (enabled by the `cli` feature only)"
        );
    }
    let cli: Vec<&str> = m["features"]["cli"]
        .as_array()
        .expect("a `cli` feature")
        .iter()
        .filter_map(|f| f.as_str())
        .collect();
    for dep in ["dep:clap", "dep:anyhow"] {
        assert!(cli.contains(&dep), "the `cli` feature must enable {dep}");
    }
    // The binary needs the feature; nothing else in the library may name clap or anyhow.
    let bins = m["bin"].as_array().expect("the tessera binary");
    assert_eq!(bins[0]["required-features"][0].as_str(), Some("cli"));
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "rs") && !path.ends_with("main.rs") {
            let text = std::fs::read_to_string(&path).unwrap();
            for dep in ["clap", "anyhow"] {
                assert!(
                    !text.contains(&format!("{dep}::")),
                    "{} uses {dep}: library modules must not (the CLI lives in src/cli/)",
                    path.display()
                );
            }
        }
    }
}

/// The Rust sources of the repository under `dir`, skipping build outputs and virtual
/// environments.
fn rust_sources(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            if !name.starts_with('.')
                && !matches!(name.as_str(), "target" | "venv" | "node_modules")
            {
                rust_sources(&path, out);
            }
        } else if name.ends_with(".rs") {
            out.push(path);
        }
    }
}

/// The module of the builder `#[tpu_kernel]` expands to, spelt so that this file does not
/// name it (the repository's own checks grep for it).
const PRIVATE_MODULE: &str = concat!("__", "private");

/// Where `line` names the builder `#[tpu_kernel]` expands to: its module, a `__`-prefixed
/// method call on the builder, or associated function (`KernelDef::__new`).
fn names_the_private_builder(line: &str) -> bool {
    line.contains(PRIVATE_MODULE)
        || [".__", "::__"].iter().any(|sep| {
            line.match_indices(sep).any(|(i, _)| {
                line[i + sep.len()..]
                    .chars()
                    .next()
                    .is_some_and(|c| c.is_ascii_lowercase())
            })
        })
}

#[test]
fn only_the_macro_and_the_dsl_name_the_private_builder() {
    assert!(names_the_private_builder(concat!(
        "let s = b.",
        "__arg(\"x\", DType::F32, 2)?;"
    )));
    assert!(names_the_private_builder(
        "KernelDef::__new(name, params, args, loc, build)"
    ));
    assert!(names_the_private_builder(&format!(
        "use tessera_dsl::{PRIVATE_MODULE}::Builder;"
    )));
    assert!(!names_the_private_builder("fn __hash__(&self) -> u64 {"));
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_sources(root, &mut files);
    let this = Path::new(file!());
    let offenders: Vec<String> = files
        .iter()
        .filter(|f| {
            let rel = f.strip_prefix(root).unwrap();
            !rel.starts_with("dsl") && !rel.starts_with("macros") && !rel.ends_with(this)
        })
        .flat_map(|f| {
            let text = std::fs::read_to_string(f).unwrap();
            let rel = f.strip_prefix(root).unwrap().display().to_string();
            text.lines()
                .enumerate()
                .filter(|(_, l)| names_the_private_builder(l))
                .map(|(i, l)| format!("{rel}:{}: {}", i + 1, l.trim()))
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(
        files.len() > 100,
        "found only {} Rust files under {}",
        files.len(),
        root.display()
    );
    assert!(
        offenders.is_empty(),
        "the builder behind `#[tpu_kernel]` is for the code it generates; write these kernels \
         with the macro:\n{}",
        offenders.join("\n")
    );
}

/// The markdown files a newcomer reads, with every relative link they hold.
fn doc_links(file: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let mut links = Vec::new();
    for part in text.split("](").skip(1) {
        let target = part.split([')', '#', ' ']).next().unwrap_or_default();
        if !target.is_empty() && !target.starts_with("http") {
            links.push(target.to_string());
        }
    }
    links
}

/// README.md is the entrance (the two commands first, at most 300 lines; measurements live in
/// docs/), and no relative link of the README or docs/ points nowhere.
#[test]
fn the_readme_is_an_entrance_and_the_docs_links_resolve() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(
        lines <= 300,
        "README.md has {lines} lines; move detail to docs/"
    );
    let first_code = readme.split("```sh\n").nth(1).expect("a sh block");
    let commands: Vec<&str> = first_code
        .lines()
        .take_while(|l| !l.starts_with("```"))
        .filter(|l| !l.starts_with('#'))
        .collect();
    assert_eq!(
        &commands[..2],
        [
            "cargo run --release --example train",
            "cargo test --workspace"
        ]
    );
    let mut files = vec![root.join("README.md"), root.join("python/README.md")];
    for entry in std::fs::read_dir(root.join("docs")).unwrap() {
        files.push(entry.unwrap().path());
    }
    for file in files {
        for link in doc_links(&file) {
            let target = file.parent().unwrap().join(&link);
            assert!(
                target.exists(),
                "{}: the link to {link} points nowhere",
                file.display()
            );
        }
    }
}

/// The import circles left inside parallel/ and dsl/, each with why: a new circle fails the
/// test below, and so does a listed one that is gone (so the list stays true).
const KNOWN_CIRCLES: &[(&[&str], &str)] = &[];

/// No two modules of parallel/ or dsl/ import each other, directly or round a circle (see
/// `modules` for what counts as an import), beyond [`KNOWN_CIRCLES`].
#[test]
fn parallel_and_dsl_have_no_import_circles() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut found = Vec::new();
    for krate in ["parallel", "dsl"] {
        let graph = ModuleGraph::read(&root.join(krate).join("src"));
        found.extend(graph.circles(root));
    }
    let known: Vec<Vec<String>> = KNOWN_CIRCLES
        .iter()
        .map(|(files, _)| files.iter().map(|f| f.to_string()).collect())
        .collect();
    let new: Vec<&Vec<String>> = found.iter().filter(|c| !known.contains(c)).collect();
    let gone: Vec<&Vec<String>> = known.iter().filter(|c| !found.contains(c)).collect();
    assert!(
        new.is_empty(),
        "import circles (each group's modules reach each other); move what they share below \
         both:\n{new:#?}"
    );
    assert!(
        gone.is_empty(),
        "these circles are gone; take them off KNOWN_CIRCLES:\n{gone:#?}"
    );
}

/// The string literals of `code` (escapes kept as written), and with `docs` its `///` doc
/// comments (a CLI's help strings), test modules left out.
fn texts_of(code: &str, docs: bool) -> Vec<String> {
    let code = code.split("#[cfg(test)]").next().unwrap_or_default();
    let mut texts = Vec::new();
    for line in code.lines().filter(|_| docs) {
        if let Some(doc) = line.trim_start().strip_prefix("///") {
            texts.push(doc.to_string());
        }
    }
    let mut chars = code.chars().peekable();
    let (mut current, mut in_string, mut comment) = (String::new(), false, false);
    while let Some(c) = chars.next() {
        if comment {
            comment = c != '\n';
        } else if in_string {
            match c {
                '\\' => {
                    chars.next();
                }
                '"' => {
                    texts.push(std::mem::take(&mut current));
                    in_string = false;
                }
                _ => current.push(c),
            }
        } else if c == '/' && chars.peek() == Some(&'/') {
            comment = true;
        } else if c == '"' {
            in_string = true;
        } else if c == '\'' {
            // A char literal (`'"'`) or a lifetime: skip the char and its closing quote.
            if let (Some(_), Some('\'')) = (chars.next(), chars.peek()) {
                chars.next();
            }
        }
    }
    texts
}

/// The strategies `text` spells as words (`{placeholders}` left out), each once by its name.
fn strategies_named(text: &str, spellings: &[(String, String)]) -> BTreeSet<String> {
    let mut plain = String::new();
    let mut depth = 0;
    for c in text.chars() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            _ if depth == 0 => plain.push(c),
            _ => {}
        }
    }
    plain
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'))
        .filter_map(|word| {
            spellings
                .iter()
                .find(|(spelling, _)| spelling == word)
                .map(|(_, name)| name.clone())
        })
        .collect()
}

/// Strategy names are written once, in their units (parallel/src/context/strategy/): help
/// strings, `demo`, `bench`, messages and the step-time model read the list. A string of the
/// CLI, the trainer, the JAX extension or the rest of parallel/, or a help line of the CLI or
/// the extension, that is one strategy's spelling or names two strategies is a list written
/// by hand.
#[test]
fn strategy_names_are_written_only_in_their_units() {
    let mut spellings: Vec<(String, String)> = Vec::new();
    for s in tessera::parallel::Strategy::listed(4) {
        let name = s.name();
        let base = name.split(':').next().unwrap_or_default().to_string();
        for spelling in [name.clone(), base.clone(), s.maxtext_name()] {
            spellings.push((spelling, base.clone()));
        }
    }
    assert!(spellings.len() >= 8, "{spellings:?}");
    assert_eq!(
        strategies_named("the all_gather and ring strategies", &spellings).len(),
        2
    );
    assert!(strategies_named("{ulysses} x {ring}: all-gathered", &spellings).is_empty());
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    // (file, literal, why it is not a strategy's name)
    let not_strategies = [(
        "parallel/src/context/layout.rs",
        "ring",
        "the name of the ring mesh axis",
    )];
    let mut files = Vec::new();
    for dir in ["src/cli", "train/src", "parallel/src", "python/src"] {
        rust_sources(&root.join(dir), &mut files);
    }
    let mut offenders = Vec::new();
    for file in &files {
        let rel = file.strip_prefix(root).unwrap().display().to_string();
        if rel.starts_with("parallel/src/context/strategy/") {
            continue;
        }
        let code = std::fs::read_to_string(file).unwrap();
        // Doc comments are help strings in the CLI and the Python extension.
        let docs = rel.starts_with("src/cli") || rel.starts_with("python/src");
        for text in texts_of(&code, docs) {
            let named = strategies_named(&text, &spellings);
            let exact = spellings.iter().any(|(s, _)| *s == text);
            let excused = not_strategies
                .iter()
                .any(|(f, literal, _)| *f == rel && *literal == text);
            if (named.len() >= 2 || exact) && !excused {
                offenders.push(format!("{rel}: {text:?}"));
            }
        }
    }
    assert!(files.len() > 30, "found only {} files", files.len());
    assert!(
        offenders.is_empty(),
        "strategy names written outside parallel/src/context/strategy/; read them from \
         `Strategy::listed`, `Strategy::names` or `Strategy::spellings`:\n{}",
        offenders.join("\n")
    );
}

/// The top-level arguments (whitespace removed) of the generic list that opens just before
/// `open` in `text`; `->` and `=>` inside it are not brackets. None if it does not close.
fn generic_args(text: &str, open: usize) -> Option<Vec<String>> {
    let mut depth = 1;
    let mut args = vec![String::new()];
    let mut prev = ' ';
    for c in text[open..].chars() {
        match c {
            '<' | '(' | '[' => depth += 1,
            '>' if prev != '-' && prev != '=' => depth -= 1,
            ')' | ']' => depth -= 1,
            ';' | '{' => return None,
            _ => {}
        }
        if depth == 0 {
            args.retain(|a| !a.is_empty());
            return Some(args);
        }
        if c == ',' && depth == 1 {
            args.push(String::new());
        } else if !c.is_whitespace() {
            args.last_mut().expect("never empty").push(c);
        }
        prev = c;
    }
    None
}

/// The `Result<.., String>` types in `text` (also spread over lines), whitespace removed.
fn string_results(text: &str) -> Vec<String> {
    text.match_indices("Result<")
        .filter_map(|(i, m)| generic_args(text, i + m.len()))
        .filter(|args| args.len() == 2 && args[1] == "String")
        .map(|args| format!("Result<{}, String>", args[0]))
        .collect()
}

/// The `pub enum ..Error` declarations in `text` with a bare `Variant(String)`, by name.
fn errors_with_string_variants(text: &str) -> Vec<String> {
    let code: String = text
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let mut found = Vec::new();
    for (i, m) in code.match_indices("pub enum ") {
        let rest = &code[i + m.len()..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let Some(open) = rest.find('{') else { continue };
        if !name.ends_with("Error") {
            continue;
        }
        let mut depth = 0;
        let body = rest[open..]
            .chars()
            .take_while(|&c| {
                depth += match c {
                    '{' => 1,
                    '}' => -1,
                    _ => 0,
                };
                depth > 0
            })
            .filter(|c| !c.is_whitespace())
            .collect::<String>()
            .replace(",)", ")");
        if body.contains("(String)") || body.contains("(std::string::String)") {
            found.push(name);
        }
    }
    found
}

/// Errors are thiserror enums with structured fields: no `Result<_, String>` in the kernel IR
/// (dsl/) or the Mosaic evaluator (mosaic-eval/), and no public error enum of the workspace
/// with a bare `Variant(String)` catch-all.
#[test]
fn errors_are_typed() {
    assert_eq!(
        string_results("fn f(\n    x: u8,\n) -> Result<\n    Vec<u8>,\n    String,\n> {"),
        ["Result<Vec<u8>, String>"]
    );
    assert_eq!(
        string_results("type R<T> = Result<T, String>; fn g() -> Result<(), MyError> {"),
        ["Result<T, String>"]
    );
    assert!(string_results("Result<HashMap<String, usize>, E>; Result<fn() -> u8, E>").is_empty());
    assert_eq!(
        errors_with_string_variants(
            "pub enum BadError {\n    /// (String)\n    A { name: String },\n    B(\n        String,\n    ),\n}\npub enum Good { C(String) }"
        ),
        ["BadError"]
    );
    assert!(
        errors_with_string_variants("pub enum OkError { A { s: String }, B(Inner) }").is_empty()
    );

    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let this = Path::new(file!());
    let mut files = Vec::new();
    rust_sources(root, &mut files);
    let mut offenders = Vec::new();
    for f in &files {
        let rel = f.strip_prefix(root).unwrap();
        if rel.ends_with(this) {
            continue;
        }
        let text = std::fs::read_to_string(f).unwrap();
        if rel.starts_with("dsl") || rel.starts_with("mosaic-eval") {
            for r in string_results(&text) {
                offenders.push(format!("{}: {r}", rel.display()));
            }
        }
        for e in errors_with_string_variants(&text) {
            offenders.push(format!(
                "{}: pub enum {e} has a `(String)` variant",
                rel.display()
            ));
        }
    }
    assert!(
        offenders.is_empty(),
        "errors are thiserror enums with structured fields (the values the message names as \
         fields, a cause as #[source]), not strings:\n{}",
        offenders.join("\n")
    );
}
