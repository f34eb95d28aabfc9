//! Every message the published crates show a user that names a function or
//! a type names one that exists: a rename cannot leave a message behind
//! telling users to write what no longer compiles.
//!
//! What counts as a message: every string literal in the crates' code
//! outside their tests and doc comments — statuses, `warn!` and `error!`,
//! panics and `expect`s, errors' `Display`, a `Debug` impl's name — and
//! the text of `#[must_use]` and `#[deprecated]`, which the compiler shows
//! users. What
//! counts as a name in it (see [`names_in`]):
//!
//! - a path, `Type::method`, `module::Item`, `tonic_deadline::x::Y`: two
//!   or more identifiers joined by `::` (not followed by `:`, which makes
//!   it a URL such as `sqlite::memory:`);
//! - a method call, `.method(` (after a receiver or `...`);
//! - a type, a word in `CamelCase` with two capitals or more
//!   (`ReadyChannel`), bar a few words that are names of things, not of
//!   code ([`NOT_CODE`]);
//! - a word in backticks (`` `build` ``, `` `Scope` ``).
//!
//! A bare `snake_case` word is not taken: in the crates' messages they are
//! as often SQL, settings or another stack's terms (`statement_timeout`,
//! h2's `too_many_data_frames`) as our functions.
//!
//! Each is checked against the crates' public items, read from their
//! sources with `syn`: items declared `pub` (the workspace's
//! `unreachable_pub` lint makes every one of them reachable from its
//! crate's root), `pub use` re-exports, and the associated items of impls
//! (an inherent impl's `pub` ones, all of a trait impl's) and variants of
//! enums. A path that starts with a crate's name is resolved module by
//! module through re-exports; `Type::item` needs a public type of that
//! name with that associated item; `module::Item` a public module of that
//! name that resolves the rest; `.method(` an associated function of that
//! name on some public type or trait; a word in backticks such a function,
//! a public function or module, or a crate. A `Debug` impl's name
//! (`debug_struct("X")`) needs a type `X` in its crate, public or not.
//!
//! Names of other crates' items (tonic's, tokio's) are checked by the
//! compiler: each one a message uses is listed in [`EXTERNAL`] beside code
//! that names it. A message that names an item of another crate the table
//! does not list fails the test too.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use proc_macro2::TokenTree;
use syn::visit::Visit;

/// The published crates: their directories and their names in code.
const CRATES: &[(&str, &str)] = &[
    ("grpc-deadline", "grpc_deadline"),
    ("grpc-deadline-db", "grpc_deadline_db"),
    ("grpc-deadline-grpc", "grpc_deadline_grpc"),
    ("grpc-deadline-jobs", "grpc_deadline_jobs"),
    ("grpc-deadline-reqwest", "grpc_deadline_reqwest"),
    ("tonic-deadline", "tonic_deadline"),
    ("tonic-deadline-db", "tonic_deadline_db"),
    ("tonic-deadline-guard", "tonic_deadline_guard"),
    ("tonic-deadline-jobs", "tonic_deadline_jobs"),
];

/// Words in `CamelCase` that name a thing, not an item of code.
const NOT_CODE: &[&str] = &["NaN", "OpenMetrics", "PostgreSQL", "OpenTelemetry"];

/// Other crates' items that messages name, each beside code that names it
/// (compiled, never run): a rename upstream breaks the build. The code
/// must spell every segment of the name.
macro_rules! external {
    ($($name:literal => $code:expr),* $(,)?) => {
        #[allow(dead_code, clippy::disallowed_methods)]
        fn compiled() {
            $(let _ = $code;)*
        }
        const EXTERNAL: &[(&str, &str)] = &[$(($name, stringify!($code))),*];
    };
}

external! {
    "Endpoint::http2_max_concurrent_reset_streams" =>
        tonic::transport::Endpoint::http2_max_concurrent_reset_streams,
    "Endpoint::http2_max_local_error_reset_streams" =>
        |endpoint: tonic::transport::Endpoint| endpoint.http2_max_local_error_reset_streams(None),
    "tokio::spawn" => tokio::spawn::<std::future::Ready<()>>,
}

/// The root crates of other crates' paths a message may name (as
/// `tokio::spawn`): such a path must be in [`EXTERNAL`].
const OTHER_CRATES: &[&str] = &[
    "std", "core", "alloc", "tokio", "tonic", "tower", "http", "h2", "hyper", "prost", "sqlx",
    "rusqlite", "reqwest", "axum", "tracing",
];

// ---------------------------------------------------------------------------
// The crates' items, read from their sources.
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Module,
    Type,
    Value,
}

/// One module of one crate: its public items, its re-exports, its modules.
#[derive(Debug, Default)]
struct Module {
    /// Public items declared here.
    items: BTreeMap<String, Kind>,
    /// Modules declared here, public or not (a `pub use` may reach into a
    /// private one).
    children: BTreeSet<String>,
    /// `pub use`: the name it brings, and the path it names.
    uses: BTreeMap<String, Vec<String>>,
    /// `pub use path::*`.
    globs: Vec<Vec<String>>,
    /// Every `use`, public or not: the name it brings, the path it names.
    imports: BTreeMap<String, Vec<String>>,
    /// Traits declared here that are not public.
    private_traits: BTreeSet<String>,
}

#[derive(Debug, Default)]
struct Index {
    /// (crate, module path) → module.
    modules: BTreeMap<(String, Vec<String>), Module>,
    /// Type or trait name → its associated items and variants, across
    /// every impl in the crates.
    assoc: BTreeMap<String, BTreeSet<String>>,
    /// Trait impls: where (crate, module), the trait's path as written,
    /// the type, the items it gives the type. A private trait's items are
    /// not the type's public API.
    trait_impls: Vec<TraitImpl>,
    /// Every type a crate declares, public or not: (crate, name).
    all_types: BTreeSet<(String, String)>,
}

fn is_pub(vis: &syn::Visibility) -> bool {
    matches!(vis, syn::Visibility::Public(_))
}

/// Whether `attrs` holds `#[cfg(test)]` or `#[cfg(all(test, ..))]`, or
/// `#[test]`.
fn is_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|attr| {
        if attr.path().is_ident("test") {
            return true;
        }
        if !attr.path().is_ident("cfg") {
            return false;
        }
        let Ok(list) = attr.meta.require_list() else {
            return false;
        };
        let tokens = list.tokens.to_string().replace(' ', "");
        tokens == "test" || tokens.starts_with("all(test,")
    })
}

fn path_attr(attrs: &[syn::Attribute]) -> Option<String> {
    attrs.iter().find_map(|attr| {
        let syn::Meta::NameValue(nv) = &attr.meta else {
            return None;
        };
        if !nv.path.is_ident("path") {
            return None;
        }
        match &nv.value {
            syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(s),
                ..
            }) => Some(s.value()),
            _ => None,
        }
    })
}

/// The last identifier of a type as written (`Foo<T>` → `Foo`).
fn type_name(ty: &syn::Type) -> Option<String> {
    match ty {
        syn::Type::Path(p) => p.path.segments.last().map(|s| s.ident.to_string()),
        _ => None,
    }
}

/// A source file read, and the module path it is.
struct Source {
    krate: String,
    file: PathBuf,
    module: Vec<String>,
    syntax: syn::File,
}

/// Reads `file` as module `module` of `krate`, and every module it declares
/// outside its tests.
fn read_module(krate: &str, file: &Path, module: Vec<String>, out: &mut Vec<Source>) {
    let text = std::fs::read_to_string(file)
        .unwrap_or_else(|e| panic!("{} must be readable: {e}", file.display()));
    let syntax =
        syn::parse_file(&text).unwrap_or_else(|e| panic!("{} must parse: {e}", file.display()));
    // `lib.rs` and `mod.rs` declare modules beside them; `x.rs` in `x/`.
    let stem = file.file_stem().and_then(|s| s.to_str()).unwrap_or("");
    let dir = if stem == "lib" || stem == "mod" {
        file.parent().expect("a file has a directory").to_owned()
    } else {
        file.with_extension("")
    };
    fn declared(
        krate: &str,
        items: &[syn::Item],
        dir: &Path,
        module: &[String],
        out: &mut Vec<Source>,
    ) {
        for item in items {
            let syn::Item::Mod(m) = item else { continue };
            if is_test(&m.attrs) {
                continue;
            }
            let mut path = module.to_vec();
            path.push(m.ident.to_string());
            match &m.content {
                // Inline modules are read with their file.
                Some((_, inner)) => {
                    declared(krate, inner, &dir.join(m.ident.to_string()), &path, out)
                }
                None => {
                    let file = match path_attr(&m.attrs) {
                        Some(p) => dir.join(p),
                        None => {
                            let flat = dir.join(format!("{}.rs", m.ident));
                            if flat.exists() {
                                flat
                            } else {
                                dir.join(m.ident.to_string()).join("mod.rs")
                            }
                        }
                    };
                    read_module(krate, &file, path, out);
                }
            }
        }
    }
    declared(krate, &syntax.items, &dir, &module, out);
    out.push(Source {
        krate: krate.to_owned(),
        file: file.to_owned(),
        module,
        syntax,
    });
}

/// Flattens a `use` tree into (name brought, path named) and globs.
fn use_tree(
    tree: &syn::UseTree,
    prefix: &mut Vec<String>,
    uses: &mut Vec<(String, Vec<String>)>,
    globs: &mut Vec<Vec<String>>,
) {
    match tree {
        syn::UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            use_tree(&p.tree, prefix, uses, globs);
            prefix.pop();
        }
        syn::UseTree::Name(n) => {
            let mut path = prefix.clone();
            path.push(n.ident.to_string());
            let name = if n.ident == "self" {
                prefix.last().cloned().unwrap_or_default()
            } else {
                n.ident.to_string()
            };
            uses.push((name, path));
        }
        syn::UseTree::Rename(r) => {
            let mut path = prefix.clone();
            path.push(r.ident.to_string());
            uses.push((r.rename.to_string(), path));
        }
        syn::UseTree::Glob(_) => globs.push(prefix.clone()),
        syn::UseTree::Group(g) => {
            for tree in &g.items {
                use_tree(tree, prefix, uses, globs);
            }
        }
    }
}

/// Indexes `items`, module `module` of `krate`.
fn index_items(index: &mut Index, krate: &str, module: &[String], items: &[syn::Item]) {
    let key = (krate.to_owned(), module.to_vec());
    index.modules.entry(key.clone()).or_default();
    for item in items {
        let (attrs, public, name, kind): (&[syn::Attribute], bool, Option<String>, Kind) =
            match item {
                syn::Item::Fn(f) => (
                    &f.attrs,
                    is_pub(&f.vis),
                    Some(f.sig.ident.to_string()),
                    Kind::Value,
                ),
                syn::Item::Const(c) => (
                    &c.attrs,
                    is_pub(&c.vis),
                    Some(c.ident.to_string()),
                    Kind::Value,
                ),
                syn::Item::Static(s) => (
                    &s.attrs,
                    is_pub(&s.vis),
                    Some(s.ident.to_string()),
                    Kind::Value,
                ),
                syn::Item::Struct(s) => (
                    &s.attrs,
                    is_pub(&s.vis),
                    Some(s.ident.to_string()),
                    Kind::Type,
                ),
                syn::Item::Union(u) => (
                    &u.attrs,
                    is_pub(&u.vis),
                    Some(u.ident.to_string()),
                    Kind::Type,
                ),
                syn::Item::Type(t) => (
                    &t.attrs,
                    is_pub(&t.vis),
                    Some(t.ident.to_string()),
                    Kind::Type,
                ),
                syn::Item::Enum(e) => {
                    if !is_test(&e.attrs) {
                        let variants = index.assoc.entry(e.ident.to_string()).or_default();
                        variants.extend(e.variants.iter().map(|v| v.ident.to_string()));
                    }
                    (
                        &e.attrs,
                        is_pub(&e.vis),
                        Some(e.ident.to_string()),
                        Kind::Type,
                    )
                }
                syn::Item::Trait(t) => {
                    if !is_pub(&t.vis) {
                        let module_of = index.modules.get_mut(&key).expect("entered above");
                        module_of.private_traits.insert(t.ident.to_string());
                    } else if !is_test(&t.attrs) {
                        let members = index.assoc.entry(t.ident.to_string()).or_default();
                        for member in &t.items {
                            match member {
                                syn::TraitItem::Fn(f) => members.insert(f.sig.ident.to_string()),
                                syn::TraitItem::Const(c) => members.insert(c.ident.to_string()),
                                syn::TraitItem::Type(t) => members.insert(t.ident.to_string()),
                                _ => false,
                            };
                        }
                    }
                    (
                        &t.attrs,
                        is_pub(&t.vis),
                        Some(t.ident.to_string()),
                        Kind::Type,
                    )
                }
                syn::Item::Mod(m) => {
                    if !is_test(&m.attrs) {
                        let module_of = index.modules.get_mut(&key).expect("entered above");
                        module_of.children.insert(m.ident.to_string());
                        if let Some((_, inner)) = &m.content {
                            let mut path = module.to_vec();
                            path.push(m.ident.to_string());
                            index_items(index, krate, &path, inner);
                        }
                    }
                    (
                        &m.attrs,
                        is_pub(&m.vis),
                        Some(m.ident.to_string()),
                        Kind::Module,
                    )
                }
                syn::Item::Macro(m) => {
                    // Items declared in a macro's input, as `pin_project!`'s.
                    if m.ident.is_none()
                        && !is_test(&m.attrs)
                        && let Ok(inner) = syn::parse2::<syn::File>(m.mac.tokens.clone())
                    {
                        index_items(index, krate, module, &inner.items);
                    }
                    let exported = m.attrs.iter().any(|a| a.path().is_ident("macro_export"));
                    (
                        &m.attrs,
                        exported,
                        m.ident.as_ref().map(ToString::to_string),
                        Kind::Value,
                    )
                }
                syn::Item::Use(u) => {
                    if !is_test(&u.attrs) {
                        let (mut uses, mut globs) = (Vec::new(), Vec::new());
                        use_tree(&u.tree, &mut Vec::new(), &mut uses, &mut globs);
                        let module_of = index.modules.get_mut(&key).expect("entered above");
                        module_of.imports.extend(uses.iter().cloned());
                        if is_pub(&u.vis) {
                            module_of.uses.extend(uses);
                            module_of.globs.extend(globs);
                        }
                    }
                    continue;
                }
                syn::Item::Impl(i) => {
                    if is_test(&i.attrs) {
                        continue;
                    }
                    let Some(owner) = type_name(&i.self_ty) else {
                        continue;
                    };
                    let of_trait = i.trait_.as_ref().map(|(_, path, _)| {
                        path.segments
                            .iter()
                            .map(|s| s.ident.to_string())
                            .collect::<Vec<_>>()
                    });
                    let all = of_trait.is_some();
                    let members = i.items.iter().filter_map(|member| match member {
                        syn::ImplItem::Fn(f) if all || is_pub(&f.vis) => {
                            Some(f.sig.ident.to_string())
                        }
                        syn::ImplItem::Const(c) if all || is_pub(&c.vis) => {
                            Some(c.ident.to_string())
                        }
                        _ => None,
                    });
                    match of_trait {
                        Some(path) => index.trait_impls.push(TraitImpl {
                            krate: krate.to_owned(),
                            module: module.to_vec(),
                            path,
                            owner,
                            members: members.collect(),
                        }),
                        None => index.assoc.entry(owner).or_default().extend(members),
                    }
                    continue;
                }
                _ => continue,
            };
        let Some(name) = name else { continue };
        if is_test(attrs) {
            continue;
        }
        if kind == Kind::Type {
            index.all_types.insert((krate.to_owned(), name.clone()));
        }
        if public {
            let module_of = index.modules.get_mut(&key).expect("entered above");
            module_of.items.insert(name, kind);
        }
    }
}

#[derive(Debug)]
struct TraitImpl {
    krate: String,
    module: Vec<String>,
    path: Vec<String>,
    owner: String,
    members: Vec<String>,
}

/// What a path resolved to.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Resolved {
    Module(String, Vec<String>),
    Type(String),
    Value,
    /// A re-export of another crate's item: the compiler checked the
    /// re-export; what follows it is not read here.
    Elsewhere,
}

impl Index {
    fn crate_of(name: &str) -> Option<&'static str> {
        CRATES
            .iter()
            .find(|(_, code)| *code == name)
            .map(|(_, code)| *code)
    }

    /// Resolves `segments` from module `module` of `krate`.
    fn resolve(&self, krate: &str, module: &[String], segments: &[String]) -> Option<Resolved> {
        let mut at = Resolved::Module(krate.to_owned(), module.to_vec());
        for segment in segments {
            at = match at {
                Resolved::Module(k, m) => self.in_module(&k, &m, segment, 0)?,
                Resolved::Type(owner) => {
                    if !self.assoc.get(&owner).is_some_and(|a| a.contains(segment)) {
                        return None;
                    }
                    Resolved::Value
                }
                Resolved::Value => return None,
                Resolved::Elsewhere => return Some(Resolved::Elsewhere),
            };
        }
        Some(at)
    }

    /// `name` in module `module` of `krate`.
    fn in_module(&self, krate: &str, module: &[String], name: &str, depth: u8) -> Option<Resolved> {
        if depth > 8 {
            return None;
        }
        let m = self.modules.get(&(krate.to_owned(), module.to_vec()))?;
        if let Some(kind) = m.items.get(name) {
            return Some(match kind {
                Kind::Module => {
                    let mut path = module.to_vec();
                    path.push(name.to_owned());
                    Resolved::Module(krate.to_owned(), path)
                }
                Kind::Type => Resolved::Type(name.to_owned()),
                Kind::Value => Resolved::Value,
            });
        }
        if let Some(target) = m.uses.get(name) {
            return self.use_target(krate, module, target, depth + 1);
        }
        for glob in &m.globs {
            if let Some(Resolved::Module(k, g)) = self.use_target(krate, module, glob, depth + 1)
                && let Some(found) = self.in_module(&k, &g, name, depth + 1)
            {
                return Some(found);
            }
        }
        None
    }

    /// What a `use` path written in module `module` of `krate` names.
    fn use_target(
        &self,
        krate: &str,
        module: &[String],
        path: &[String],
        depth: u8,
    ) -> Option<Resolved> {
        let (first, rest) = path.split_first()?;
        let mut at = match first.as_str() {
            "crate" => Resolved::Module(krate.to_owned(), Vec::new()),
            "self" => Resolved::Module(krate.to_owned(), module.to_vec()),
            "super" => Resolved::Module(
                krate.to_owned(),
                module[..module.len().saturating_sub(1)].to_vec(),
            ),
            other => match Self::crate_of(other) {
                Some(k) => Resolved::Module(k.to_owned(), Vec::new()),
                None => {
                    let m = self.modules.get(&(krate.to_owned(), module.to_vec()))?;
                    if m.children.contains(other) {
                        let mut child = module.to_vec();
                        child.push(other.to_owned());
                        Resolved::Module(krate.to_owned(), child)
                    } else {
                        return Some(Resolved::Elsewhere);
                    }
                }
            },
        };
        for segment in rest {
            at = match at {
                Resolved::Module(k, m) => {
                    // A `use` may name a private child or item on its way.
                    let here = self.modules.get(&(k.clone(), m.clone()))?;
                    if here.children.contains(segment) && !here.items.contains_key(segment) {
                        let mut child = m.clone();
                        child.push(segment.clone());
                        Resolved::Module(k, child)
                    } else {
                        self.in_module(&k, &m, segment, depth + 1)?
                    }
                }
                Resolved::Type(_) | Resolved::Value => return None,
                Resolved::Elsewhere => return Some(Resolved::Elsewhere),
            };
        }
        Some(at)
    }

    /// Whether some public type or trait of the crates is called `name`
    /// (declared so, or re-exported under that name, another crate's type
    /// included).
    fn public_type(&self, name: &str) -> bool {
        self.modules.iter().any(|((k, m), module)| {
            module.items.get(name) == Some(&Kind::Type)
                || (module.uses.contains_key(name)
                    && matches!(
                        self.in_module(k, m, name, 0),
                        Some(Resolved::Type(_) | Resolved::Elsewhere)
                    ))
        })
    }

    /// The public modules called `name`, in any crate.
    fn public_modules(&self, name: &str) -> Vec<Resolved> {
        self.modules
            .iter()
            .filter_map(|((k, m), _)| match self.in_module(k, m, name, 0) {
                Some(found @ Resolved::Module(..)) => Some(found),
                _ => None,
            })
            .collect()
    }

    /// Whether some public function, constant or static is called `name`.
    fn public_value(&self, name: &str) -> bool {
        self.modules
            .values()
            .any(|module| module.items.get(name) == Some(&Kind::Value))
    }

    /// Gives each type the items of the traits it implements that are
    /// public: ours declared `pub`, or another crate's (`Layer`, `Debug`).
    fn settle(&mut self) {
        for i in std::mem::take(&mut self.trait_impls) {
            if self.trait_is_public(&i.krate, &i.module, &i.path) {
                self.assoc.entry(i.owner).or_default().extend(i.members);
            }
        }
    }

    /// Whether the trait `path` names in module `module` of `krate` is
    /// public: ours declared `pub`, or another crate's (the prelude's too).
    fn trait_is_public(&self, krate: &str, module: &[String], path: &[String]) -> bool {
        let Some(here) = self.modules.get(&(krate.to_owned(), module.to_vec())) else {
            return false;
        };
        let full: Vec<String> = match here.imports.get(&path[0]) {
            Some(imported) => imported.iter().chain(&path[1..]).cloned().collect(),
            None => path.to_vec(),
        };
        if let [name] = full.as_slice() {
            return here.items.get(name) == Some(&Kind::Type)
                || !here.private_traits.contains(name);
        }
        matches!(
            self.use_target(krate, module, &full, 0),
            Some(Resolved::Type(_) | Resolved::Elsewhere)
        )
    }

    /// Whether some public type or trait has an associated function `name`.
    fn has_method(&self, name: &str) -> bool {
        self.assoc
            .iter()
            .any(|(owner, members)| members.contains(name) && self.public_type(owner))
    }
}

// ---------------------------------------------------------------------------
// The messages, and the names in them.
// ---------------------------------------------------------------------------

/// One string literal of the crates' code.
#[derive(Debug)]
struct Message {
    krate: String,
    file: PathBuf,
    line: usize,
    text: String,
    /// It names its type in a `Debug` impl (`debug_struct("X")`).
    debug_name: bool,
}

struct Literals<'a> {
    krate: &'a str,
    file: &'a Path,
    found: Vec<Message>,
}

impl Literals<'_> {
    fn push(&mut self, lit: &syn::LitStr, debug_name: bool) {
        self.found.push(Message {
            krate: self.krate.to_owned(),
            file: self.file.to_owned(),
            line: lit.span().start().line,
            text: lit.value(),
            debug_name,
        });
    }

    fn tokens(&mut self, tokens: proc_macro2::TokenStream) {
        let mut trees = tokens.into_iter().peekable();
        while let Some(tree) = trees.next() {
            match tree {
                // An attribute (a doc comment) in a macro's input.
                TokenTree::Punct(p) if p.as_char() == '#' => {
                    if matches!(trees.peek(), Some(TokenTree::Group(g)) if g.delimiter() == proc_macro2::Delimiter::Bracket)
                    {
                        trees.next();
                    }
                }
                TokenTree::Group(g) => self.tokens(g.stream()),
                TokenTree::Literal(l) => {
                    if let syn::Lit::Str(s) = syn::Lit::new(l) {
                        self.push(&s, false);
                    }
                }
                _ => {}
            }
        }
    }
}

impl<'ast> Visit<'ast> for Literals<'_> {
    // Doc comments and attributes are not messages, but for the text the
    // compiler shows users: `#[must_use = ".."]`, `#[deprecated(note = "..")]`.
    fn visit_attribute(&mut self, attr: &'ast syn::Attribute) {
        if attr.path().is_ident("must_use")
            && let syn::Meta::NameValue(syn::MetaNameValue {
                value:
                    syn::Expr::Lit(syn::ExprLit {
                        lit: syn::Lit::Str(s),
                        ..
                    }),
                ..
            }) = &attr.meta
        {
            self.push(s, false);
        }
        if attr.path().is_ident("deprecated") {
            let _ = attr.parse_nested_meta(|meta| {
                if meta.path.is_ident("note") {
                    let note: syn::LitStr = meta.value()?.parse()?;
                    self.push(&note, false);
                }
                Ok(())
            });
        }
    }

    fn visit_item(&mut self, item: &'ast syn::Item) {
        let attrs = match item {
            syn::Item::Fn(i) => &i.attrs,
            syn::Item::Mod(i) => &i.attrs,
            syn::Item::Impl(i) => &i.attrs,
            syn::Item::Const(i) => &i.attrs,
            syn::Item::Static(i) => &i.attrs,
            syn::Item::Macro(i) => &i.attrs,
            _ => return syn::visit::visit_item(self, item),
        };
        // A module's own `mod` is read from its file; tests are not read.
        if is_test(attrs) || matches!(item, syn::Item::Mod(m) if m.content.is_none()) {
            return;
        }
        syn::visit::visit_item(self, item);
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        if !is_test(&f.attrs) {
            syn::visit::visit_impl_item_fn(self, f);
        }
    }

    fn visit_lit_str(&mut self, lit: &'ast syn::LitStr) {
        self.push(lit, false);
    }

    fn visit_expr_method_call(&mut self, call: &'ast syn::ExprMethodCall) {
        if (call.method == "debug_struct" || call.method == "debug_tuple")
            && let Some(syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(s),
                ..
            })) = call.args.first()
        {
            self.push(s, true);
            self.visit_expr(&call.receiver);
            return;
        }
        syn::visit::visit_expr_method_call(self, call);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        self.tokens(mac.tokens.clone());
    }
}

/// A name a message uses, as written.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Name {
    Path(Vec<String>),
    Method(String),
    Type(String),
    /// A word in backticks that is not a type: a function, method, module
    /// or crate.
    Word(String),
}

impl std::fmt::Display for Name {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Name::Path(p) => f.write_str(&p.join("::")),
            Name::Method(m) => write!(f, ".{m}(..)"),
            Name::Type(t) => f.write_str(t),
            Name::Word(w) => write!(f, "`{w}`"),
        }
    }
}

fn is_camel(word: &str) -> bool {
    let mut chars = word.chars();
    chars.next().is_some_and(|c| c.is_ascii_uppercase())
        && word.chars().filter(char::is_ascii_uppercase).count() >= 2
        && word.chars().any(|c| c.is_ascii_lowercase())
        && word.chars().all(|c| c.is_ascii_alphanumeric())
        && !NOT_CODE.contains(&word)
}

/// The code-like names in `text` (the rules are the module's).
fn names_in(text: &str) -> Vec<Name> {
    let bytes = text.as_bytes();
    let ident = |at: usize| -> usize {
        let mut end = at;
        while end < bytes.len() && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_') {
            end += 1;
        }
        end
    };
    let mut names = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let c = bytes[at];
        let starts = (c.is_ascii_alphabetic() || c == b'_')
            && (at == 0 || !(bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_'));
        if !starts {
            at += 1;
            continue;
        }
        let begin = at;
        let mut segments = Vec::new();
        let mut end = ident(at);
        segments.push(text[at..end].to_owned());
        while text[end..].starts_with("::")
            && bytes
                .get(end + 2)
                .is_some_and(|c| c.is_ascii_alphabetic() || *c == b'_')
        {
            let next = ident(end + 2);
            segments.push(text[end + 2..next].to_owned());
            end = next;
        }
        at = end;
        let after = bytes.get(end).copied();
        if segments.len() > 1 {
            if after != Some(b':') {
                names.push(Name::Path(segments));
            }
            continue;
        }
        let word = segments.pop().expect("one segment");
        let after_dot = begin > 0 && bytes[begin - 1] == b'.';
        let in_backticks = begin > 0 && bytes[begin - 1] == b'`' && after == Some(b'`');
        if after_dot && after == Some(b'(') {
            names.push(Name::Method(word));
        } else if in_backticks {
            names.push(if word.starts_with(|c: char| c.is_ascii_uppercase()) {
                Name::Type(word)
            } else {
                Name::Word(word)
            });
        } else if is_camel(&word) && !after_dot {
            // (After a dot, a word is part of a dotted name, as a protobuf
            // type's `google.rpc.DebugInfo`.)
            names.push(Name::Type(word));
        }
    }
    names
}

/// The names `message` uses: a `Debug` impl's name is one whole.
fn names_of(message: &Message) -> Vec<Name> {
    if message.debug_name {
        vec![Name::Type(message.text.clone())]
    } else {
        names_in(&message.text)
    }
}

/// Whether the table of other crates' items lists `name`.
fn external(name: &Name) -> bool {
    let written = name.to_string();
    EXTERNAL.iter().any(|(listed, _)| *listed == written)
}

/// Why `name`, in a message of `krate`, names nothing; `None` if it names
/// something.
fn check(index: &Index, message: &Message, name: &Name) -> Option<String> {
    match name {
        Name::Type(t) if message.debug_name => (!index
            .all_types
            .contains(&(message.krate.clone(), t.clone())))
        .then(|| format!("no type {t} in {}", message.krate)),
        Name::Type(t) => (!index.public_type(t) && !external(name))
            .then(|| format!("no public type {t}, and no other crate's in the table")),
        Name::Method(m) => (!index.has_method(m) && !external(name)).then(|| {
            format!("no public type or trait has a method {m}, and no other crate's in the table")
        }),
        Name::Word(w) => (!index.has_method(w)
            && !index.public_value(w)
            && index.public_modules(w).is_empty()
            && Index::crate_of(w).is_none()
            && !OTHER_CRATES.contains(&w.as_str())
            && !external(name))
        .then(|| {
            format!(
                "no public function, method or module {w}, no crate of that name, and no other \
                 crate's in the table"
            )
        }),
        Name::Path(segments) => {
            let (first, rest) = segments.split_first().expect("a path has segments");
            if let Some(k) = Index::crate_of(first) {
                return match index.resolve(k, &[], rest) {
                    Some(_) => None,
                    None => Some(format!("{name} does not resolve in {k}")),
                };
            }
            if external(name) {
                return None;
            }
            if OTHER_CRATES.contains(&first.as_str()) {
                return Some(format!("{name} is another crate's item, not in the table"));
            }
            if first.chars().next().is_some_and(|c| c.is_ascii_uppercase()) {
                if !index.public_type(first) {
                    return Some(format!(
                        "no public type {first}, and no other crate's in the table"
                    ));
                }
                let members = index.assoc.get(first.as_str());
                return match rest {
                    [item] if members.is_some_and(|m| m.contains(item)) => None,
                    _ => Some(format!(
                        "{first} has no associated item {}",
                        rest.join("::")
                    )),
                };
            }
            let resolves = index.public_modules(first).into_iter().any(|module| {
                let Resolved::Module(k, m) = module else {
                    return false;
                };
                index.resolve(&k, &m, rest).is_some()
            });
            (!resolves).then(|| format!("no public module {first} in which {name} resolves"))
        }
    }
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the workspace's directory")
}

/// Every crate's sources, indexed, and the messages in them: read once
/// for the tests below.
fn read() -> &'static (Index, Vec<Message>) {
    static READ: std::sync::OnceLock<(Index, Vec<Message>)> = std::sync::OnceLock::new();
    READ.get_or_init(read_sources)
}

fn read_sources() -> (Index, Vec<Message>) {
    let mut sources = Vec::new();
    for (dir, code) in CRATES {
        let lib = workspace().join("crates").join(dir).join("src/lib.rs");
        read_module(code, &lib, Vec::new(), &mut sources);
    }
    let mut index = Index::default();
    let mut messages = Vec::new();
    for source in &sources {
        index_items(
            &mut index,
            &source.krate,
            &source.module,
            &source.syntax.items,
        );
        let mut literals = Literals {
            krate: &source.krate,
            file: &source.file,
            found: Vec::new(),
        };
        literals.visit_file(&source.syntax);
        messages.extend(literals.found);
    }
    index.settle();
    (index, messages)
}

#[test]
fn every_name_a_message_uses_is_one_the_crates_or_the_table_have() {
    let (index, messages) = read();
    let root = workspace();
    let mut named = 0;
    let mut checked = BTreeSet::new();
    let mut wrong = String::new();
    for message in messages {
        for name in names_of(message) {
            named += 1;
            if let Some(why) = check(index, message, &name) {
                let file = message.file.strip_prefix(&root).unwrap_or(&message.file);
                let _ = writeln!(
                    wrong,
                    "{}:{}: {name}: {why}\n    in {:?}",
                    file.display(),
                    message.line,
                    message.text
                );
            }
            checked.insert(name);
        }
    }
    eprintln!(
        "{} string literals; {named} names in them, {} different: {}",
        messages.len(),
        checked.len(),
        checked
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    );
    assert!(
        wrong.is_empty(),
        "messages that name what does not exist:\n{wrong}"
    );
    // The reading is not blind: it sees the crates' messages and names.
    assert!(
        messages.len() > 500 && checked.len() > 30,
        "too few messages ({}) or names ({}) read: the sources moved?",
        messages.len(),
        checked.len()
    );
}

#[test]
fn every_entry_of_the_table_of_other_crates_names_is_spelled_by_its_code_and_used() {
    let (_, messages) = read();
    let used: BTreeSet<String> = messages
        .iter()
        .flat_map(|m| names_in(&m.text))
        .map(|n| n.to_string())
        .collect();
    for (name, code) in EXTERNAL {
        let code = code.replace(' ', "");
        for segment in name.split("::") {
            assert!(
                code.contains(segment),
                "{name}: its code must name {segment}: {code}"
            );
        }
        assert!(used.contains(*name), "{name}: no message names it any more");
    }
}

/// The rules that pick names out of a message, on messages like the
/// crates' own.
#[test]
fn names_are_paths_method_calls_and_camel_case_types() {
    let names =
        |text: &str| -> Vec<String> { names_in(text).iter().map(ToString::to_string).collect() };
    assert_eq!(
        names("serve with guard.builder()...serve_tls(addr, ServerTls::new(cert, key))?"),
        [".builder(..)", ".serve_tls(..)", "ServerTls::new"]
    );
    assert_eq!(
        names("use tonic_deadline::server::ResetGuard, as ReadyChannel does"),
        ["tonic_deadline::server::ResetGuard", "ReadyChannel"]
    );
    assert_eq!(
        names("a builder does nothing until `build`; the `Scope` ends at `unix:`"),
        ["`build`", "Scope"]
    );
    assert!(
        names("sqlite::memory: at http://127.0.0.1:80, HTTP/2 GOAWAY, NaN, e.g. the Scope")
            .is_empty(),
        "URLs, capitals and single words are not code"
    );
}

/// The check on names that exist and names that do not, on the crates'
/// own index.
#[test]
fn the_check_tells_a_name_that_exists_from_one_that_does_not() {
    let (index, _) = read();
    let message = |text: &str| Message {
        krate: "tonic_deadline_guard".to_owned(),
        file: PathBuf::from("src/guard.rs"),
        line: 1,
        text: text.to_owned(),
        debug_name: false,
    };
    let wrong = |text: &str| -> Vec<String> {
        let message = message(text);
        names_in(text)
            .iter()
            .filter(|name| check(index, &message, name).is_some())
            .map(ToString::to_string)
            .collect()
    };
    for good in [
        "ServerTls::new(cert_pem, key_pem)",
        "guard.incoming_tls(incoming, tls)",
        "tonic_deadline::server::ResetGuard",
        "tonic_deadline::server::ResetGuard::hold_after_cut",
        "tonic_deadline::observe::Metrics",
        "observe::Metrics",
        "server::ResetGuard",
        "tonic_deadline::spawn",
        "tonic_deadline::Scope::enter",
        "Endpoint::http2_max_concurrent_reset_streams(0)",
        "GuardedRouter",
        "until `build`, over `tonic`",
    ] {
        assert_eq!(
            wrong(good),
            Vec::<String>::new(),
            "{good} names what exists"
        );
    }
    for (bad, name) in [
        ("ServerTls::from_pem(cert, key)?", "ServerTls::from_pem"),
        ("guard.incoming_tl(incoming)", ".incoming_tl(..)"),
        (
            "tonic_deadline::server::ResetGaurd",
            "tonic_deadline::server::ResetGaurd",
        ),
        (
            "tonic_deadline::observe::ResetGuard",
            "tonic_deadline::observe::ResetGuard",
        ),
        ("observe::Metric", "observe::Metric"),
        ("ResetGuard::hold_after_cuts", "ResetGuard::hold_after_cuts"),
        ("Server::timeout", "Server::timeout"),
        ("tokio::task::spawn_local", "tokio::task::spawn_local"),
        ("GuardedRouters", "GuardedRouters"),
        ("until `built`", "`built`"),
        // A method of a private trait (the resilience layer's observer,
        // which `Metrics` implements), and a `pub(crate)` one.
        ("until `pushback_stop`", "`pushback_stop`"),
        ("until `flood_cut`", "`flood_cut`"),
    ] {
        assert_eq!(wrong(bad), [name], "{bad} names what does not exist");
    }
}
