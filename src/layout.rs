//! The serialized layout of a job's types, and its fingerprint: see [`Layout`], which this
//! module traces (with `serde_reflection`) and caches per job type.

use std::any::TypeId;
use std::collections::HashMap;
use std::fmt;
use std::sync::{Mutex, OnceLock};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_reflection::{ContainerFormat, Format, Named, Registry, Tracer, TracerConfig};

use crate::Job;

/// The serialized layout of a job's types: one entry per role, then one per field or enum
/// variant of every struct and enum they contain. Serialized as its list of entries.
///
/// A snapshot holds postcard bytes of the job value, its chunk states, chunk outputs and the
/// reduced value. Postcard is not self-describing: bytes written by one struct read into
/// another whose fields have the same types in another order (two `f64` swapped) without an
/// error, and a field appended fails somewhere in the middle with "hit the end of buffer".
/// [`Job::VERSION`](crate::Job::VERSION) guards against this only when someone remembers to
/// bump it.
///
/// So every snapshot records the layout of the types it holds, traced automatically from
/// their serde derive: every field name and type, in order, of the job, the chunk, the chunk
/// output (the reducer's value) and, for a job with owned partitions, the halo. On resume
/// the layout of the resuming program's types is compared with the snapshot's before any byte
/// of the job or of a chunk state is decoded; a difference is
/// [`snapshot::Error::LayoutChanged`](crate::snapshot::Error::LayoutChanged), naming the
/// snapshot, both fingerprints and the first entry that differs.
///
/// # How a layout is traced
///
/// With [`serde_reflection`]: each type is deserialized once from a tracing deserializer that
/// records what it is asked for (struct and field names, primitive types, sequences, maps,
/// options, enum variants). Nothing is serialized and no value of the job is needed. The
/// result is a list of entries, one per field or variant, named by type (`Kernel.n: u64`),
/// sorted by type name, after one entry per role (`job: Kernel`). It is computed once per job
/// type in a process and cached.
///
/// # Untraceable types
///
/// Tracing needs types whose `Deserialize` accepts whatever the tracer hands it. It fails for
/// serde attributes of self-describing formats (`#[serde(flatten)]`, `untagged`, internally
/// or adjacently tagged enums), for `deserialize_any`, for a custom `Deserialize` that
/// refuses the tracer's placeholder values (integers are traced as 1, floats as 0, strings
/// and sequences empty), and for two different types with the same name. Then the layout is
/// [`Layout::untraceable`]: the job still runs and snapshots, its types are just not checked
/// on resume (a snapshot whose layout, or the resuming program's, is untraceable is resumed
/// as before, logged at `info`); keep `Job::VERSION` current for such a job. Tracing never
/// makes a job fail.
///
/// What a layout does not see: a custom `Serialize`/`Deserialize` whose bytes change while
/// the calls it makes to serde do not (the crate's own [`Rows`](crate::Rows) bands store
/// their cells as one block of bytes, so the element type is not in the layout), and the
/// meaning of a field. [`Job::VERSION`](crate::Job::VERSION) stays for those: bump it when
/// the meaning of the bytes changes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Layout {
    entries: Vec<String>,
}

/// The only entry of the layout of types that cannot be traced.
const UNTRACEABLE: &str = "untraceable";

/// A 64-bit fingerprint (FNV-1a) of a [`Layout`]'s entries, or of a job value's bytes
/// ([`Error::ResumedJobDiffers`](crate::Error::ResumedJobDiffers)), shown as 16 hex digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Fingerprint(pub u64);

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

impl Layout {
    /// The layout of job `J`'s types: the job, its chunk, the chunk output and, for a job
    /// with owned partitions, the halo. Traced at the first call for each job type in a
    /// process, then cached; [`Layout::untraceable`] if a type cannot be traced (never an
    /// error, never a panic: a panic of a type's `Deserialize` while it is traced is caught).
    pub fn of<J: Job>() -> &'static Layout {
        static CACHE: OnceLock<Mutex<HashMap<TypeId, &'static Layout>>> = OnceLock::new();
        let cache = CACHE.get_or_init(Default::default);
        let key = TypeId::of::<J>();
        if let Some(layout) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
            return layout;
        }
        // Traced outside the lock (a user's `Deserialize` runs); two threads may both trace,
        // and the first to insert wins: the results are equal.
        let layout = trace_job::<J>();
        let mut cache = cache.lock().unwrap_or_else(|e| e.into_inner());
        cache
            .entry(key)
            .or_insert_with(|| Box::leak(Box::new(layout)))
    }

    /// A layout from its entries, as [`Layout::entries`] gives them (a manifest holds them
    /// so).
    pub fn from_entries(entries: Vec<String>) -> Layout {
        Layout { entries }
    }

    /// The layout of types that could not be traced.
    pub fn untraceable() -> Layout {
        Layout {
            entries: vec![UNTRACEABLE.to_owned()],
        }
    }

    /// Whether the types were traced (this is not [`Layout::untraceable`]).
    pub fn is_traced(&self) -> bool {
        self.entries != [UNTRACEABLE]
    }

    /// The entries, in order: `job: Name`, `chunk: Name`, `output: …`, `halo: …`, then
    /// `Type.field: type` and `Enum::Variant: …` for every container, sorted by name.
    pub fn entries(&self) -> &[String] {
        &self.entries
    }

    /// The fingerprint of this layout: equal layouts have equal fingerprints.
    pub fn fingerprint(&self) -> Fingerprint {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for entry in &self.entries {
            for &byte in entry.as_bytes().iter().chain(b"\n") {
                hash ^= u64::from(byte);
                hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
            }
        }
        Fingerprint(hash)
    }

    /// The first entry where this layout (a snapshot's) and `code` (the resuming program's)
    /// differ, described with both sides; `None` when they are equal. An entry only one side
    /// has there (a field added or removed) is named as such; otherwise both entries are
    /// (a field renamed, retyped or moved).
    pub fn first_difference(&self, code: &Layout) -> Option<String> {
        self.first_difference_between(code, "the snapshot", "this program")
    }

    /// [`Layout::first_difference`] between this layout, `mine` (as "the snapshot",
    /// "the coordinator"), and `other`'s, `theirs` ("this program", "the worker process").
    pub(crate) fn first_difference_between(
        &self,
        other: &Layout,
        mine: &str,
        theirs: &str,
    ) -> Option<String> {
        let (snapshot, program) = (&self.entries, &other.entries);
        let at = snapshot
            .iter()
            .zip(program)
            .position(|(s, p)| s != p)
            .unwrap_or(snapshot.len().min(program.len()));
        match (snapshot.get(at), program.get(at)) {
            (None, None) => None,
            (Some(s), None) => Some(format!("{mine} has `{s}`, which {theirs} does not")),
            (None, Some(p)) => Some(format!("{theirs} has `{p}`, which {mine} does not")),
            (Some(s), Some(p)) => {
                let added = program[at..].contains(s) && !snapshot[at..].contains(p);
                let removed = snapshot[at..].contains(p) && !program[at..].contains(s);
                Some(if added {
                    format!("{theirs} has `{p}`, which {mine} does not")
                } else if removed {
                    format!("{mine} has `{s}`, which {theirs} does not")
                } else {
                    format!("{mine} has `{s}` where {theirs} has `{p}`")
                })
            }
        }
    }
}

/// Traces one more type with `tracer` (a role of a job), for [`Hooks`](crate::job::Hooks)
/// of a type only known where the job's traits are.
pub(crate) type Trace = fn(&mut Tracer) -> serde_reflection::Result<Format>;

/// Traces `T` (every variant of an enum root).
pub(crate) fn trace<T: DeserializeOwned>(tracer: &mut Tracer) -> serde_reflection::Result<Format> {
    tracer.trace_simple_type::<T>().map(|(format, _)| format)
}

/// The first field whose value differs between `a` and `b`, as `Type.field` (the innermost
/// struct's, `Grid.width`; `Enum::Variant` when the variants differ), found by tracing both
/// values and walking them side by side; `None` when they trace equal or cannot be traced
/// (never an error: this only helps a message).
pub(crate) fn first_differing_field<T: Serialize>(a: &T, b: &T) -> Option<String> {
    let walked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut tracer = Tracer::new(config());
        let mut samples = serde_reflection::Samples::new();
        let (format, x) = tracer.trace_value(&mut samples, a).ok()?;
        let (_, y) = tracer.trace_value(&mut samples, b).ok()?;
        let registry = tracer.registry_unchecked();
        differs(&format, &x, &y, &registry, None)
    }));
    walked.ok().flatten()
}

/// Where `x` and `y`, two values of `format`, first differ: the innermost named field, or
/// `at` (the field holding them) when they differ as a whole.
fn differs(
    format: &Format,
    x: &serde_reflection::Value,
    y: &serde_reflection::Value,
    registry: &Registry,
    at: Option<&str>,
) -> Option<String> {
    use serde_reflection::Value;
    if x == y {
        return None;
    }
    let here = || Some(at.map_or_else(|| "the job value".to_owned(), str::to_owned));
    let fields = |name: &str, fields: &[Named<Format>], xs: &[Value], ys: &[Value]| {
        let (f, x, y) = fields
            .iter()
            .zip(xs.iter().zip(ys))
            .map(|(f, (x, y))| (f, x, y))
            .find(|(_, x, y)| x != y)?;
        let path = format!("{name}.{}", f.name);
        differs(&f.value, x, y, registry, Some(&path)).or(Some(path))
    };
    match (format, x, y) {
        (Format::TypeName(name), _, _) => match (registry.get(name)?, x, y) {
            (ContainerFormat::Struct(fs), Value::Seq(xs), Value::Seq(ys)) => {
                fields(name, fs, xs, ys)
            }
            (ContainerFormat::NewTypeStruct(f), _, _) => differs(f, x, y, registry, at),
            (ContainerFormat::Enum(variants), Value::Variant(i, xv), Value::Variant(j, yv)) => {
                let variant = variants.get(i)?;
                let path = format!("{name}::{}", variant.name);
                if i != j {
                    return Some(path);
                }
                use serde_reflection::VariantFormat as V;
                match (&variant.value, &**xv, &**yv) {
                    (V::Struct(fs), Value::Seq(xs), Value::Seq(ys)) => fields(&path, fs, xs, ys),
                    (V::NewType(f), _, _) => differs(f, xv, yv, registry, Some(&path)),
                    _ => Some(path),
                }
            }
            _ => here(),
        },
        (Format::Option(f), Value::Option(Some(x)), Value::Option(Some(y))) => {
            differs(f, x, y, registry, at)
        }
        _ => here(),
    }
}

/// Tracing passes at most: each pass over the roots traces one more variant of every enum
/// found inside them (by name, then by index), so this bounds the variants of a nested enum
/// that can be traced.
const MAX_PASSES: usize = 1024;

fn trace_job<J: Job>() -> Layout {
    let mut roots: Vec<(&str, Trace)> = vec![
        ("job", trace::<J>),
        ("chunk", trace::<J::Chunk>),
        ("output", trace::<<J::Chunk as crate::Chunk>::Output>),
    ];
    if let Some(hooks) = J::OWNERSHIP.hooks {
        roots.push(("halo", hooks.trace_halo));
    }
    let traced = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| trace_roots(&roots)));
    match traced {
        Ok(Ok(layout)) => layout,
        Ok(Err(e)) => {
            tracing::info!(
                job = J::NAME,
                error = %e,
                "the layout of the job's types cannot be traced: snapshots of it will not be \
                 checked against a change of its types on resume (keep Job::VERSION current)"
            );
            Layout::untraceable()
        }
        Err(_) => {
            tracing::info!(
                job = J::NAME,
                "a type of the job panicked while its layout was traced: snapshots of it will \
                 not be checked against a change of its types on resume (keep Job::VERSION \
                 current)"
            );
            Layout::untraceable()
        }
    }
}

/// Traces every root, in passes until every enum inside them is complete, and renders the
/// result.
///
/// The tracer visits one more variant of an enum found inside a root each time the root is
/// traced, but only once the enum's mark of "incomplete" is cleared; it marks the enum again
/// on the way. The names of those enums are only known from a failed attempt (the registry
/// lists them), so: trace, learn the incomplete enums' names, and trace again from scratch
/// with twice the passes, clearing their marks before each pass.
fn trace_roots(roots: &[(&str, Trace)]) -> serde_reflection::Result<Layout> {
    let mut enums = std::collections::BTreeSet::<String>::new();
    let mut passes = 1;
    loop {
        let mut tracer = Tracer::new(config());
        let mut formats = Vec::with_capacity(roots.len());
        for _ in 0..passes {
            for name in &enums {
                tracer.check_incomplete_enum(name.as_str());
            }
            formats.clear();
            for (role, trace) in roots {
                formats.push((*role, trace(&mut tracer)?));
            }
        }
        match tracer.registry() {
            Ok(registry) => return Ok(render(&formats, &registry)),
            Err(serde_reflection::Error::MissingVariants(names)) if passes < MAX_PASSES => {
                enums.extend(names);
                passes *= 2;
            }
            Err(e) => return Err(e),
        }
    }
}

/// The tracer's settings: postcard is not human-readable; integers are traced as 1, so that
/// the `NonZero` types trace.
fn config() -> TracerConfig {
    TracerConfig::default()
        .is_human_readable(false)
        .default_u8_value(1)
        .default_u16_value(1)
        .default_u32_value(1)
        .default_u64_value(1)
        .default_u128_value(1)
        .default_i8_value(1)
        .default_i16_value(1)
        .default_i32_value(1)
        .default_i64_value(1)
        .default_i128_value(1)
}

fn render(roots: &[(&str, Format)], registry: &Registry) -> Layout {
    let mut entries: Vec<String> = roots
        .iter()
        .map(|(role, format)| format!("{role}: {}", name(format)))
        .collect();
    for (container, format) in registry {
        match format {
            ContainerFormat::UnitStruct => entries.push(format!("{container}: unit")),
            ContainerFormat::NewTypeStruct(f) => {
                entries.push(format!("{container}.0: {}", name(f)));
            }
            ContainerFormat::TupleStruct(fs) => {
                for (i, f) in fs.iter().enumerate() {
                    entries.push(format!("{container}.{i}: {}", name(f)));
                }
                if fs.is_empty() {
                    entries.push(format!("{container}: ()"));
                }
            }
            ContainerFormat::Struct(fields) => {
                fields_of(&mut entries, container, fields);
                if fields.is_empty() {
                    entries.push(format!("{container}: {{}}"));
                }
            }
            ContainerFormat::Enum(variants) => {
                for (index, variant) in variants {
                    let at = format!("{container}::{}", variant.name);
                    use serde_reflection::VariantFormat as V;
                    match &variant.value {
                        V::Unit => entries.push(format!("{at}: #{index}")),
                        V::NewType(f) => entries.push(format!("{at}: #{index} ({})", name(f))),
                        V::Tuple(fs) => {
                            let fs: Vec<String> = fs.iter().map(name).collect();
                            entries.push(format!("{at}: #{index} ({})", fs.join(", ")));
                        }
                        V::Struct(fields) => {
                            entries.push(format!("{at}: #{index} {{}}"));
                            fields_of(&mut entries, &at, fields);
                        }
                        V::Variable(_) => entries.push(format!("{at}: #{index} ?")),
                    }
                }
            }
        }
    }
    Layout { entries }
}

fn fields_of(entries: &mut Vec<String>, at: &str, fields: &[Named<Format>]) {
    for field in fields {
        entries.push(format!("{at}.{}: {}", field.name, name(&field.value)));
    }
}

/// A format's name in an entry: Rust's names for primitives, the container's name for a
/// struct or an enum.
fn name(format: &Format) -> String {
    match format {
        Format::Variable(_) => "?".to_owned(),
        Format::TypeName(n) => n.clone(),
        Format::Unit => "()".to_owned(),
        Format::Bool => "bool".to_owned(),
        Format::I8 => "i8".to_owned(),
        Format::I16 => "i16".to_owned(),
        Format::I32 => "i32".to_owned(),
        Format::I64 => "i64".to_owned(),
        Format::I128 => "i128".to_owned(),
        Format::U8 => "u8".to_owned(),
        Format::U16 => "u16".to_owned(),
        Format::U32 => "u32".to_owned(),
        Format::U64 => "u64".to_owned(),
        Format::U128 => "u128".to_owned(),
        Format::F32 => "f32".to_owned(),
        Format::F64 => "f64".to_owned(),
        Format::Char => "char".to_owned(),
        Format::Str => "string".to_owned(),
        Format::Bytes => "bytes".to_owned(),
        Format::Option(f) => format!("Option<{}>", name(f)),
        Format::Seq(f) => format!("Vec<{}>", name(f)),
        Format::Map { key, value } => format!("Map<{}, {}>", name(key), name(value)),
        Format::Tuple(fs) => {
            let fs: Vec<String> = fs.iter().map(name).collect();
            format!("({})", fs.join(", "))
        }
        Format::TupleArray { content, size } => format!("[{}; {size}]", name(content)),
    }
}

#[cfg(test)]
mod tests {
    use std::ops::Range;

    use serde::{Deserialize, Serialize};

    use super::*;
    use crate::reduce::Sum;
    use crate::{Chunk, Step};

    /// A job type `$job` named "drift" whose value is `$def`, with a chunk of its own.
    macro_rules! job {
        ($module:ident, $def:item) => {
            mod $module {
                use super::*;

                #[derive(Serialize, Deserialize)]
                $def

                #[derive(Serialize, Deserialize)]
                pub(super) struct DriftChunk {
                    next: u64,
                    acc: f64,
                }

                impl Job for Drift {
                    const NAME: &'static str = "drift";
                    type Chunk = DriftChunk;
                    type Reducer = Sum<f64>;
                    type Input = ();
                    fn iterations(&self) -> u64 {
                        1
                    }
                    fn chunk(&self, range: Range<u64>) -> DriftChunk {
                        DriftChunk { next: range.start, acc: 0.0 }
                    }
                    fn reducer(&self) -> Sum<f64> {
                        Sum::new()
                    }
                }

                impl Chunk for DriftChunk {
                    type Job = Drift;
                    type Output = f64;
                    fn step(&mut self, _: &Drift, _: &()) -> Step<f64> {
                        Step::Done(self.acc)
                    }
                }
            }
        };
    }

    job!(
        first,
        pub(super) struct Drift {
            n: u64,
            scale: f64,
            offset: f64,
            mode: Mode,
        }
    );
    job!(
        swapped,
        pub(super) struct Drift {
            n: u64,
            offset: f64,
            scale: f64,
            mode: Mode,
        }
    );
    job!(
        appended,
        pub(super) struct Drift {
            n: u64,
            scale: f64,
            offset: f64,
            mode: Mode,
            extra: f64,
        }
    );
    job!(
        flattened,
        pub(super) struct Drift {
            n: u64,
            #[serde(flatten)]
            inner: Inner,
        }
    );
    job!(
        panicky,
        pub(super) struct Drift {
            n: u64,
            touchy: Touchy,
        }
    );

    /// An enum inside the job: every variant is traced.
    #[derive(Serialize, Deserialize)]
    enum Mode {
        Still,
        Walk(f64),
        Jump { height: f32, far: Option<Vec<u8>> },
    }

    #[derive(Serialize, Deserialize)]
    struct Inner {
        a: u64,
    }

    /// A type whose `Deserialize` panics.
    #[derive(Serialize)]
    struct Touchy;

    impl<'de> Deserialize<'de> for Touchy {
        fn deserialize<D: serde::Deserializer<'de>>(_: D) -> Result<Touchy, D::Error> {
            panic!("not while tracing")
        }
    }

    #[test]
    fn a_job_is_traced_field_by_field() {
        let layout = Layout::of::<first::Drift>();
        assert!(layout.is_traced());
        let entries = layout.entries();
        for entry in [
            "job: Drift",
            "chunk: DriftChunk",
            "output: f64",
            "Drift.n: u64",
            "Drift.scale: f64",
            "Drift.offset: f64",
            "Drift.mode: Mode",
            "DriftChunk.next: u64",
            "DriftChunk.acc: f64",
            "Mode::Still: #0",
            "Mode::Walk: #1 (f64)",
            "Mode::Jump: #2 {}",
            "Mode::Jump.height: f32",
            "Mode::Jump.far: Option<Vec<u8>>",
        ] {
            assert!(entries.iter().any(|e| e == entry), "{entry}: {entries:#?}");
        }
        // Cached: the same layout, not traced again.
        assert!(std::ptr::eq(layout, Layout::of::<first::Drift>()));
    }

    #[test]
    fn swapped_fields_differ_at_the_first_swapped_field() {
        let (a, b) = (Layout::of::<first::Drift>(), Layout::of::<swapped::Drift>());
        assert_ne!(a.fingerprint(), b.fingerprint());
        assert_eq!(
            a.first_difference(b).unwrap(),
            "the snapshot has `Drift.scale: f64` where this program has `Drift.offset: f64`"
        );
    }

    #[test]
    fn an_appended_field_is_named() {
        let (a, b) = (
            Layout::of::<first::Drift>(),
            Layout::of::<appended::Drift>(),
        );
        assert_ne!(a.fingerprint(), b.fingerprint());
        assert_eq!(
            a.first_difference(b).unwrap(),
            "this program has `Drift.extra: f64`, which the snapshot does not"
        );
        assert_eq!(
            b.first_difference(a).unwrap(),
            "the snapshot has `Drift.extra: f64`, which this program does not"
        );
        assert_eq!(a.first_difference(a), None);
        // Retyped, and at the end of one side.
        let entries = |e: &[&str]| Layout::from_entries(e.iter().map(|e| e.to_string()).collect());
        let f64s = entries(&["job: A", "A.x: f64"]);
        let f32s = entries(&["job: A", "A.x: f32"]);
        assert_eq!(
            f64s.first_difference(&f32s).unwrap(),
            "the snapshot has `A.x: f64` where this program has `A.x: f32`"
        );
        assert_eq!(
            entries(&["job: A"]).first_difference(&f64s).unwrap(),
            "this program has `A.x: f64`, which the snapshot does not"
        );
    }

    #[test]
    fn types_that_cannot_be_traced_are_untraceable_not_an_error() {
        let flattened = Layout::of::<flattened::Drift>();
        assert!(!flattened.is_traced());
        assert_eq!(flattened, &Layout::untraceable());
        let panicky = Layout::of::<panicky::Drift>();
        assert!(!panicky.is_traced());
    }

    #[derive(Serialize, Deserialize)]
    struct Harmonic {
        n: u64,
    }

    impl crate::Fold for Harmonic {
        const NAME: &'static str = "harmonic";
        type Acc = f64;
        type Reducer = Sum<f64>;
        type Input = ();
        fn iterations(&self) -> u64 {
            self.n
        }
        fn reducer(&self) -> Sum<f64> {
            Sum::new()
        }
        fn body(&self, _: &(), acc: &mut f64, i: u64) {
            *acc += 1.0 / (i + 1) as f64;
        }
    }

    #[derive(Serialize, Deserialize)]
    struct Smooth {
        n: u64,
        w: usize,
    }

    impl crate::Rows for Smooth {
        const NAME: &'static str = "smooth";
        type Element = f64;
        type Acc = f64;
        type Reducer = crate::reduce::Max<f64>;
        type Input = ();
        fn height(&self) -> u64 {
            self.n
        }
        fn width(&self) -> usize {
            self.w
        }
        fn reducer(&self) -> crate::reduce::Max<f64> {
            crate::reduce::Max::new()
        }
        fn init(&self, _: &(), i: u64, row: &mut [f64]) {
            row.fill(i as f64);
        }
        fn update(&self, _: &(), _: u64, win: crate::rows::Window<'_, f64>, _: &mut f64) {
            win.row.copy_from_slice(win.old);
        }
    }

    #[test]
    fn the_crate_s_own_jobs_are_traced() {
        let fold = Layout::of::<crate::Folded<Harmonic>>();
        assert!(fold.is_traced(), "{fold:#?}");
        assert!(
            fold.entries().iter().any(|e| e == "Harmonic.n: u64"),
            "{fold:#?}"
        );
        let rows = Layout::of::<crate::Banded<Smooth>>();
        assert!(rows.is_traced(), "{rows:#?}");
        assert!(
            rows.entries().iter().any(|e| e == "Smooth.w: u64"),
            "{rows:#?}"
        );
        assert!(
            rows.entries().iter().any(|e| e.starts_with("halo: ")),
            "{rows:#?}"
        );
    }
}
