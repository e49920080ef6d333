//! From a store URL and options to an [`ObjectStore`] and a prefix in it.
//!
//! [`object_store::parse_url_opts`], and the [`ObjectStoreScheme::parse`] behind it, know how
//! a URL maps to a backend and a prefix (percent escapes in the path decoded). What this
//! module adds on top:
//!
//! - A plain path (`snaps`, `./snaps`, `/tmp/snaps`: text without a scheme) is a folder
//!   store, a relative one resolved against the current directory, as `file://` with the
//!   absolute path (which is what [`Store::url`](super::Store::url) then shows).
//! - `file://`: the folder is created if missing (unless the caller only reads, see
//!   [`Create`]), and the store is built here rather than by
//!   `parse_url_opts`, which returns a plain `LocalFileSystem::new()` (rooted at `/`, no
//!   fsync, no cleanup of empty folders) that cannot be configured once boxed. Ours is rooted
//!   at the folder (cleanup sweeps that folder, see [`Opened::local_root`]), fsyncs every
//!   write (the commit order survives a power cut) and removes folders that deletes empty.
//! - `memory://name/…`: `object_store` refuses a host in a `memory://` URL; ours makes it the
//!   first level of the prefix (`memory://cluster` is a store under `cluster/`).
//! - `s3://`: built with `AmazonS3Builder::from_env()`, see [`open_s3`] for why.
//! - `file://` and `memory://` refuse options instead of ignoring them, an unknown S3 option
//!   is an error instead of being dropped, and a scheme other than `file`, `memory` and `s3`
//!   (`object_store` also knows `gs://`, `az://`, `http(s)://`, …) is refused with a message
//!   listing ours.
//! - Every URL that reaches a message, [`Debug`](std::fmt::Debug) or
//!   [`Store::url`](super::Store::url) is redacted: no user info, query or fragment.
//!
//! [`ObjectStoreScheme::parse`]: object_store::ObjectStoreScheme::parse

use std::path::PathBuf;
use std::sync::Arc;

use object_store::ObjectStore;
use object_store::path::Path;
use url::Url;

use super::error::{Error, Result};

/// Whether opening a `file://` store may create its folder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Create {
    /// Create it if missing: for a writer (the executor), whose first snapshot goes there.
    IfMissing,
    /// It must exist: for a reader (the `snapshots` command), which must not leave a folder
    /// behind where a misspelt path pointed.
    Never,
}

/// A store opened from a URL.
pub(crate) struct Opened {
    /// The backend.
    pub(crate) store: Arc<dyn ObjectStore>,
    /// Where in the backend the snapshot keys start.
    pub(crate) prefix: Path,
    /// The URL without credentials, for messages.
    pub(crate) url: String,
    /// The folder of a `file://` store (the backend's root, with [`Path::ROOT`] as prefix).
    pub(crate) local_root: Option<PathBuf>,
}

/// Opens the store at `url` with backend `options` (see [`Store::open_with`] for the URLs and
/// options accepted).
///
/// # Errors
///
/// [`Error::InvalidUrl`] for a URL that does not parse, an unknown scheme, a `file://` URL
/// naming a host, `s3://` without the `s3` feature or an S3 configuration the builder refuses;
/// [`Error::InvalidOption`] for an option given to `file://` or `memory://`, or an S3 option
/// `object_store` does not know; [`Error::Io`] if a `file://` folder cannot be created;
/// [`Error::NoSuchStore`] if it does not exist and `create` is [`Create::Never`].
///
/// [`Store::open_with`]: super::Store::open_with
pub(crate) fn open(url: &str, options: Vec<(String, String)>, create: Create) -> Result<Opened> {
    let parsed = match Url::parse(url) {
        Ok(parsed) => parsed,
        // No scheme: a path.
        Err(url::ParseError::RelativeUrlWithoutBase) => path_url(url)?,
        Err(e) => {
            return Err(Error::InvalidUrl {
                url: redact(url),
                reason: e.to_string(),
            });
        }
    };
    let shown = redact_url(&parsed);
    let no_options = |scheme: &str| match options.first() {
        Some((key, _)) => Err(Error::InvalidOption {
            key: key.clone(),
            reason: format!("{scheme}:// stores take no options"),
        }),
        None => Ok(()),
    };
    let (store, prefix, local_root) = match parsed.scheme() {
        "file" => {
            no_options("file")?;
            let (store, root) = open_file(&parsed, &shown, create)?;
            (store, Path::ROOT, Some(root))
        }
        "memory" => {
            no_options("memory")?;
            let (store, prefix) = open_memory(&parsed, &shown)?;
            (store, prefix, None)
        }
        "s3" => {
            let (store, prefix) = open_s3(&parsed, &shown, options)?;
            (store, prefix, None)
        }
        other => {
            return Err(invalid(
                &shown,
                format!("unsupported scheme {other:?}: use file://, memory:// or s3://"),
            ));
        }
    };
    Ok(Opened {
        store,
        prefix,
        url: shown,
        local_root,
    })
}

fn invalid(shown: &str, reason: String) -> Error {
    Error::InvalidUrl {
        url: shown.to_owned(),
        reason,
    }
}

/// The `file://` URL of the folder at `path`, a plain path (relative to the current
/// directory, or absolute).
fn path_url(path: &str) -> Result<Url> {
    let invalid = |reason: String| Error::InvalidUrl {
        url: redact(path),
        reason,
    };
    if path.is_empty() {
        return Err(invalid(
            "an empty store URL: give a folder, file:///path, memory:// or s3://bucket/prefix"
                .to_owned(),
        ));
    }
    // Lexically: `..` stays (it may cross a symbolic link), the folder need not exist.
    let absolute = std::path::absolute(path).map_err(|e| {
        invalid(format!(
            "a relative path needs the current directory, which is unknown: {e}"
        ))
    })?;
    Url::from_file_path(&absolute)
        .map_err(|()| invalid(format!("{} is not a folder path", absolute.display())))
}

/// A `file://` folder, created if missing (if `create` allows): the store, rooted at the
/// folder, and the folder.
///
/// Built here, not by `parse_url_opts`: that returns `LocalFileSystem::new()`, boxed, so
/// neither `with_fsync(true)` (a committed manifest must never name parts a power cut lost)
/// nor `with_automatic_cleanup(true)` (deleting an epoch's last object removes its folders)
/// can be set on it, and it is rooted at `/` where cleanup wants the snapshot folder.
fn open_file(url: &Url, shown: &str, create: Create) -> Result<(Arc<dyn ObjectStore>, PathBuf)> {
    // `object_store` refuses a host too, but as an unrecognised URL; this says what is wrong.
    // (`url` already turns `file://localhost/…` into `file:///…`.)
    if url
        .host_str()
        .is_some_and(|h| !h.is_empty() && h != "localhost")
    {
        return Err(invalid(
            shown,
            "a file:// URL cannot name a host".to_owned(),
        ));
    }
    let dir = url
        .to_file_path()
        .map_err(|()| invalid(shown, "expected file:///absolute/path".to_owned()))?;
    match create {
        Create::IfMissing => std::fs::create_dir_all(&dir).map_err(|source| Error::Io {
            what: format!("cannot create the snapshot folder {}", dir.display()),
            source,
        })?,
        Create::Never => match std::fs::metadata(&dir) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => {
                return Err(Error::NoSuchStore {
                    url: shown.to_owned(),
                    reason: format!("{} is a file, not a folder", dir.display()),
                });
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(Error::NoSuchStore {
                    url: shown.to_owned(),
                    reason: format!("the folder {} does not exist", dir.display()),
                });
            }
            Err(source) => {
                return Err(Error::Io {
                    what: format!("cannot read the snapshot folder {}", dir.display()),
                    source,
                });
            }
        },
    }
    let local = object_store::local::LocalFileSystem::new_with_prefix(&dir)
        .map_err(|e| Error::store("open", "", e))?
        .with_automatic_cleanup(true)
        .with_fsync(true);
    Ok((Arc::new(local), dir))
}

/// A fresh in-memory store and the prefix of `memory://`, `memory:///prefix` or
/// `memory://name/prefix` (`name/prefix`), through `parse_url_opts`.
fn open_memory(url: &Url, shown: &str) -> Result<(Arc<dyn ObjectStore>, Path)> {
    // `parse_url_opts` takes `memory:///prefix` only, without a host: a host becomes the
    // first level of the prefix.
    let path = format!("{}{}", url.host_str().unwrap_or(""), url.path());
    let normalized = Url::parse(&format!("memory:///{}", path.trim_start_matches('/')))
        .map_err(|e| invalid(shown, e.to_string()))?;
    let (store, prefix) =
        object_store::parse_url_opts(&normalized, std::iter::empty::<(&str, &str)>())
            .map_err(|e| invalid(shown, e.to_string()))?;
    Ok((Arc::from(store), prefix))
}

/// An S3-compatible bucket and the prefix of `s3://bucket/prefix`.
///
/// The prefix comes from the same parse as `parse_url_opts` ([`ObjectStoreScheme::parse`]:
/// percent escapes decoded). The store does not: `parse_url_opts` starts from
/// `AmazonS3Builder::new()`, so it does not read the `AWS_*` environment that
/// `AmazonS3Builder::from_env()` reads (credentials, endpoint, region, …; documented by
/// [`Store::open`](super::Store::open)), and it silently drops an option key it does not know,
/// where a misspelt key must be an error. Passing the environment in as options would copy
/// `from_env`, and every key has to be parsed here anyway to report a bad one, so the builder
/// is used directly.
///
/// Two options are this crate's, not `object_store`'s keys: [`RETRIES`] and
/// [`RETRY_TIMEOUT`], its client's retry policy (by default 10 retries within 3 minutes, so
/// an unreachable endpoint fails a request only after about a minute).
///
/// [`ObjectStoreScheme::parse`]: object_store::ObjectStoreScheme::parse
#[cfg(feature = "s3")]
fn open_s3(
    url: &Url,
    shown: &str,
    options: Vec<(String, String)>,
) -> Result<(Arc<dyn ObjectStore>, Path)> {
    use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
    let mut builder = AmazonS3Builder::from_env().with_url(url.as_str());
    let mut retry = object_store::RetryConfig::default();
    for (key, value) in options {
        let bad = |reason: String| Error::InvalidOption {
            key: key.clone(),
            reason,
        };
        match key.to_ascii_lowercase().as_str() {
            RETRIES => {
                retry.max_retries = value
                    .parse()
                    .map_err(|_| bad(format!("{value:?} is not a number of retries")))?;
                continue;
            }
            RETRY_TIMEOUT => {
                retry.retry_timeout = value
                    .parse::<f64>()
                    .ok()
                    .and_then(|s| std::time::Duration::try_from_secs_f64(s).ok())
                    .ok_or_else(|| bad(format!("{value:?} is not a number of seconds")))?;
                continue;
            }
            _ => {}
        }
        let config: AmazonS3ConfigKey =
            key.to_ascii_lowercase()
                .parse()
                .map_err(|e: object_store::Error| Error::InvalidOption {
                    key: key.clone(),
                    reason: e.to_string(),
                })?;
        builder = builder.with_config(config, value);
    }
    let store = builder
        .with_retry(retry)
        .build()
        .map_err(|e| invalid(shown, e.to_string()))?;
    let (_, prefix) =
        object_store::ObjectStoreScheme::parse(url).map_err(|e| invalid(shown, e.to_string()))?;
    Ok((Arc::new(store), prefix))
}

#[cfg(not(feature = "s3"))]
fn open_s3(
    _url: &Url,
    shown: &str,
    _options: Vec<(String, String)>,
) -> Result<(Arc<dyn ObjectStore>, Path)> {
    Err(invalid(
        shown,
        "s3:// stores need the `s3` feature of malleable".to_owned(),
    ))
}

/// S3 option: how many times a failed request (a connection refused, a server error) is
/// retried, with exponential backoff (default 10; `0` fails at the first error).
pub(crate) const RETRIES: &str = "max_retries";
/// S3 option: seconds after the first attempt of a request beyond which it is not retried
/// (default 180).
pub(crate) const RETRY_TIMEOUT: &str = "retry_timeout";

/// `url` without user info, query or fragment, for messages (it did not parse as a URL).
pub(crate) fn redact(url: &str) -> String {
    let without_query = url.split(['?', '#']).next().unwrap_or("");
    match without_query.split_once("://") {
        Some((scheme, rest)) => match rest.split_once('@') {
            Some((_, host)) => format!("{scheme}://{host}"),
            None => without_query.to_owned(),
        },
        None => without_query.to_owned(),
    }
}

/// `url` without user info, query or fragment.
pub(crate) fn redact_url(url: &Url) -> String {
    let mut url = url.clone();
    // These fail only for URLs that cannot have user info ("cannot-be-a-base"); nothing to
    // strip then.
    let _ = url.set_username("");
    let _ = url.set_password(None);
    url.set_query(None);
    url.set_fragment(None);
    url.to_string()
}

/// Store option keys that are not secrets (`object_store`'s S3 keys, lower case, with and
/// without their `aws_` prefix and aliases); see [`shareable_options`].
const SHAREABLE: &[&str] = &[
    "endpoint",
    "aws_endpoint",
    "aws_endpoint_url",
    "region",
    "aws_region",
    "default_region",
    "aws_default_region",
    "allow_http",
    "aws_allow_http",
    RETRIES,
    RETRY_TIMEOUT,
    "virtual_hosted_style_request",
    "aws_virtual_hosted_style_request",
    "bucket",
    "aws_bucket",
    "bucket_name",
    "aws_bucket_name",
];

/// The options among `options` that may be told to another process, a remote worker that
/// opens the same store: those whose key (compared case-insensitively) says where the bucket
/// is and how to talk to it, and nothing that proves who the caller is.
///
/// - `endpoint` (`aws_endpoint`, `aws_endpoint_url`): the server's address. The worker must
///   reach the same server; an address grants no access.
/// - `region` (`aws_region`, `default_region`, `aws_default_region`): the region requests are
///   signed for, a public name.
/// - `allow_http` (`aws_allow_http`): whether plain HTTP is allowed, a transport choice.
/// - `virtual_hosted_style_request` (`aws_…`): how the bucket is addressed (host name or
///   path), a property of the server.
/// - `bucket` (`aws_bucket`, `bucket_name`, `aws_bucket_name`): the bucket's name, which the
///   `s3://bucket/…` URL already shows.
///
/// Everything else stays with the caller: credentials (`access_key_id`, `secret_access_key`,
/// `session_token`/`token`, with or without `aws_`), files and URLs credentials come from
/// (web identity token file, container credentials, role ARN, metadata endpoint), and any key
/// not listed here, known or not. A worker takes its credentials from its own environment.
pub(crate) fn shareable_options(options: &[(String, String)]) -> Vec<(String, String)> {
    options
        .iter()
        .filter(|(key, _)| SHAREABLE.contains(&key.to_ascii_lowercase().as_str()))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Opens as a writer does (the folder created if missing).
    fn open(url: &str, options: Vec<(String, String)>) -> Result<Opened> {
        super::open(url, options, Create::IfMissing)
    }

    fn options(keys: &[&str]) -> Vec<(String, String)> {
        keys.iter()
            .map(|k| ((*k).to_owned(), "value".to_owned()))
            .collect()
    }

    #[test]
    fn a_file_url_opens_and_creates_its_folder() {
        let dir =
            std::env::temp_dir().join(format!("malleable-open-{}-{}", std::process::id(), line!()));
        let folder = dir.join("a b").join("c");
        let _ = std::fs::remove_dir_all(&dir);
        let url = Url::from_directory_path(&folder).unwrap();
        let opened = open(url.as_str(), Vec::new()).unwrap();
        assert!(folder.is_dir());
        assert_eq!(opened.local_root.as_deref(), Some(folder.as_path()));
        assert_eq!(opened.prefix, Path::ROOT);
        assert_eq!(opened.url, url.as_str());
        // An existing folder opens too.
        open(url.as_str(), Vec::new()).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn memory_urls_give_a_prefix() {
        for (url, prefix) in [
            ("memory://", ""),
            ("memory:///", ""),
            ("memory:///a/b", "a/b"),
            ("memory://cluster", "cluster"),
            ("memory://cluster/a/b", "cluster/a/b"),
            ("memory://user:pw@x/y%20z?q=1", "x/y z"),
        ] {
            let opened = open(url, Vec::new()).unwrap();
            assert_eq!(opened.prefix.as_ref(), prefix, "{url}");
            assert!(opened.local_root.is_none());
        }
        assert_eq!(
            open("memory://user:pw@x/y?q=1#f", Vec::new()).unwrap().url,
            "memory://x/y"
        );
    }

    #[test]
    fn file_and_memory_stores_refuse_options() {
        for url in [
            "memory://",
            "memory:///p",
            "file:///nonexistent/never-created",
        ] {
            match open(url, options(&["endpoint"])) {
                Err(Error::InvalidOption { key, reason }) => {
                    assert_eq!(key, "endpoint");
                    assert!(reason.contains("take no options"), "{url}: {reason}");
                }
                r => panic!("{url}: expected InvalidOption, got {:?}", r.err()),
            }
        }
        assert!(!std::path::Path::new("/nonexistent/never-created").exists());
    }

    #[test]
    fn a_file_url_cannot_name_a_host() {
        match open("file://otherhost/x", Vec::new()) {
            Err(e @ Error::InvalidUrl { .. }) => {
                assert!(e.to_string().contains("cannot name a host"), "{e}");
            }
            r => panic!("expected InvalidUrl, got {:?}", r.err()),
        }
    }

    #[test]
    fn unknown_schemes_are_refused() {
        // `object_store` knows these, but they are not snapshot stores of ours.
        for url in [
            "ftp://host/x",
            "gs://bucket/x",
            "https://host/x",
            "s3a://b/x",
        ] {
            match open(url, Vec::new()) {
                Err(e @ Error::InvalidUrl { .. }) => {
                    let text = e.to_string();
                    assert!(text.contains("unsupported scheme"), "{url}: {text}");
                    assert!(
                        text.contains("file://, memory:// or s3://"),
                        "{url}: {text}"
                    );
                }
                r => panic!("{url}: expected InvalidUrl, got {:?}", r.err()),
            }
        }
        match open("", Vec::new()) {
            Err(e @ Error::InvalidUrl { .. }) => assert!(e.to_string().contains("empty")),
            r => panic!("expected InvalidUrl, got {:?}", r.err()),
        }
    }

    /// A path without a scheme is a folder store: a relative one under the current
    /// directory, shown (and handed to worker processes) as its absolute `file://` URL.
    #[test]
    fn plain_paths_are_folder_stores() {
        /// Removes the folder, also when the test fails.
        struct Remove(std::path::PathBuf);
        impl Drop for Remove {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
        let cwd = std::env::current_dir().unwrap();
        let base = format!("malleable-plain-{}", std::process::id());
        let _remove = Remove(cwd.join(&base));
        let _ = std::fs::remove_dir_all(cwd.join(&base));
        for (path, folder) in [
            (format!("{base}/a"), cwd.join(&base).join("a")),
            (format!("./{base}/b"), cwd.join(&base).join("b")),
            (
                format!("{base}/with space"),
                cwd.join(&base).join("with space"),
            ),
        ] {
            let opened = open(&path, Vec::new()).unwrap();
            assert!(folder.is_dir(), "{path}");
            assert_eq!(
                opened.local_root.as_deref(),
                Some(folder.as_path()),
                "{path}"
            );
            assert_eq!(
                opened.url,
                Url::from_file_path(&folder).unwrap().as_str(),
                "{path}"
            );
            assert_eq!(opened.prefix, Path::ROOT);
        }
        let absolute = cwd.join(&base).join("c");
        let opened = open(absolute.to_str().unwrap(), Vec::new()).unwrap();
        assert_eq!(opened.local_root.as_deref(), Some(absolute.as_path()));
        assert!(opened.url.starts_with("file:///"), "{}", opened.url);
        // The same folder as its file:// URL.
        let again = open(&opened.url, Vec::new()).unwrap();
        assert_eq!(again.local_root, opened.local_root);
    }

    /// A reader's open never creates the folder: a missing one (or a file) is
    /// `NoSuchStore`, and is still missing afterwards.
    #[test]
    fn a_reader_does_not_create_the_folder() {
        let dir = std::env::temp_dir().join(format!("malleable-reader-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let missing = dir.join("typo");
        for url in [
            Url::from_file_path(&missing).unwrap().to_string(),
            missing.display().to_string(),
        ] {
            match super::open(&url, Vec::new(), Create::Never) {
                Err(e @ Error::NoSuchStore { .. }) => {
                    let text = e.to_string();
                    assert!(text.contains("does not exist"), "{text}");
                    assert!(text.contains("typo"), "{text}");
                }
                r => panic!("{url}: expected NoSuchStore, got {:?}", r.err()),
            }
            assert!(!missing.exists(), "{url} created {}", missing.display());
            assert!(!dir.exists(), "{url} created {}", dir.display());
        }
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("file");
        std::fs::write(&file, b"x").unwrap();
        match super::open(file.to_str().unwrap(), Vec::new(), Create::Never) {
            Err(e @ Error::NoSuchStore { .. }) => {
                assert!(e.to_string().contains("not a folder"), "{e}");
            }
            r => panic!("expected NoSuchStore, got {:?}", r.err()),
        }
        // An existing folder opens, and memory:// is always there.
        let opened = super::open(dir.to_str().unwrap(), Vec::new(), Create::Never).unwrap();
        assert_eq!(opened.local_root.as_deref(), Some(dir.as_path()));
        super::open("memory://", Vec::new(), Create::Never).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[cfg(not(feature = "s3"))]
    #[test]
    fn s3_needs_the_feature() {
        match open("s3://bucket/p", Vec::new()) {
            Err(e @ Error::InvalidUrl { .. }) => {
                assert!(e.to_string().contains("`s3` feature"), "{e}");
            }
            r => panic!("expected InvalidUrl, got {:?}", r.err()),
        }
    }

    #[cfg(feature = "s3")]
    #[test]
    fn s3_urls_give_a_prefix_and_check_options() {
        let endpoint = vec![("Endpoint".to_owned(), "http://127.0.0.1:1".to_owned())];
        let opened = open("s3://bucket/a%20b/c", endpoint).unwrap();
        assert_eq!(opened.prefix.as_ref(), "a b/c");
        assert!(opened.local_root.is_none());
        match open("s3://bucket/p", options(&["no_such_option"])) {
            Err(Error::InvalidOption { key, .. }) => assert_eq!(key, "no_such_option"),
            r => panic!("expected InvalidOption, got {:?}", r.err()),
        }
        let retries = |k: &str, v: &str| vec![(k.to_owned(), v.to_owned())];
        assert!(open("s3://bucket/p", retries("max_retries", "0")).is_ok());
        assert!(open("s3://bucket/p", retries("retry_timeout", "2.5")).is_ok());
        for (k, v) in [("max_retries", "-1"), ("retry_timeout", "soon")] {
            match open("s3://bucket/p", retries(k, v)) {
                Err(Error::InvalidOption { key, .. }) => assert_eq!(key, k),
                r => panic!("{k}={v}: expected InvalidOption, got {:?}", r.err()),
            }
        }
    }

    #[test]
    fn urls_are_redacted() {
        assert_eq!(redact("s3://key:secret@bucket/p?x=y"), "s3://bucket/p");
        assert_eq!(redact("s3://bucket/p#frag"), "s3://bucket/p");
        let url = Url::parse("s3://key:secret@bucket/p?x=y#f").unwrap();
        assert_eq!(redact_url(&url), "s3://bucket/p");
        // Through `open`: in a message for a URL that does not parse, for an unknown scheme,
        // and in the shown URL of a store.
        for url in [
            "s3://key:secret@[bucket/p?x=y",
            "ftp://key:secret@bucket/p?x=y",
        ] {
            let e = open(url, Vec::new()).err().unwrap().to_string();
            assert!(!e.contains("secret") && !e.contains("x=y"), "{e}");
        }
    }

    #[test]
    fn secrets_are_never_shareable() {
        let secrets = [
            "secret_access_key",
            "aws_secret_access_key",
            "SECRET_ACCESS_KEY",
            "AWS_SECRET_ACCESS_KEY",
            "access_key_id",
            "aws_access_key_id",
            "session_token",
            "aws_session_token",
            "token",
            "aws_token",
            "web_identity_token_file",
            "aws_web_identity_token_file",
            "role_arn",
            "aws_role_arn",
            "container_credentials_relative_uri",
            "aws_container_credentials_relative_uri",
            "container_credentials_full_uri",
            "aws_container_authorization_token_file",
            "metadata_endpoint",
            "aws_metadata_endpoint",
            "no_such_option",
        ];
        assert_eq!(shareable_options(&options(&secrets)), Vec::new());
        let public = [
            "endpoint",
            "AWS_ENDPOINT",
            "Region",
            "aws_default_region",
            "allow_http",
            "virtual_hosted_style_request",
            "bucket",
        ];
        let mut mixed = options(&secrets);
        mixed.extend(options(&public));
        assert_eq!(shareable_options(&mixed), options(&public));
    }
}
