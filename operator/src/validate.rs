//! Does a Transfer refer to pools that exist, allow it, and hold its paths?

use std::collections::{BTreeMap, BTreeSet};

use wirerate_crds::contract;
use wirerate_crds::transfer::{Role, plain_path};
use wirerate_crds::{Consent, DtnPool, Striping, Transfer, Tuning};

use crate::scheduler::Key;

/// Reasons of the Valid condition when it is False.
pub mod reason {
    /// A named pool does not exist.
    pub const POOL_NOT_FOUND: &str = "PoolNotFound";
    /// The pool does not serve the Transfer's namespace.
    pub const NAMESPACE_NOT_ALLOWED: &str = "NamespaceNotAllowed";
    /// The pool offers to serve the namespace, but the namespace has no
    /// DtnPoolBinding consenting to it.
    pub const NAMESPACE_NOT_BOUND: &str = "NamespaceNotBound";
    /// An external receiver's token Secret is missing or not marked for wirerate.
    pub const TOKEN_SECRET_NOT_USABLE: &str = "TokenSecretNotUsable";
    /// A path is outside the pool's allowed roots.
    pub const PATH_NOT_ALLOWED: &str = "PathNotAllowed";
    /// The effective tuning cannot run.
    pub const INVALID_TUNING: &str = "InvalidTuning";
    /// The Transfer's name cannot label the objects made for it.
    pub const NAME_TOO_LONG: &str = "NameTooLong";
    /// spec.pairs is out of its bounds, or above 1 toward an external receiver.
    pub const INVALID_PAIRS: &str = "InvalidPairs";
    /// Several pairs into a pool that does not declare shared storage.
    pub const STORAGE_NOT_SHARED: &str = "StorageNotShared";
    /// spec.filters past their bounds, or contradicting themselves.
    pub const INVALID_FILTERS: &str = "InvalidFilters";
    /// spec.mirror into a pool that does not allow deletes, or over
    /// several pairs.
    pub const DELETES_NOT_ALLOWED: &str = "DeletesNotAllowed";
    /// spec.keep that cannot be: an id mapped twice or to root's, or
    /// owners into a pool whose agents cannot set them.
    pub const INVALID_KEEP: &str = "InvalidKeep";
}

/// The longest Transfer name: it is a label value on its token Secret and grant.
pub const MAX_NAME: usize = 63;

/// What a valid Transfer resolves to.
#[derive(Clone, Debug, PartialEq)]
pub struct Resolved {
    /// `namespace/name` of the sending pool.
    pub sender_pool: Key,
    /// `namespace/name` of the receiving pool (None for an external receiver).
    pub receiver_pool: Option<Key>,
    /// Pool defaults with the Transfer's overrides.
    pub tuning: Tuning,
    /// Layout for the destination.
    pub striping: Option<Striping>,
    /// Pairs to run over (spec.pairs, checked): with pairsPolicy Auto,
    /// the most.
    pub pairs: usize,
    /// The most relays the sending pool may give (`status.relays`): one
    /// per pair but the sender's own, where the sending pool declares
    /// shared storage; 0 otherwise.
    pub relays: usize,
}

impl Resolved {
    /// The pools whose agents take part: the sender's, and the receiver's
    /// unless it is external.
    pub fn pools(&self) -> Vec<&Key> {
        std::iter::once(&self.sender_pool)
            .chain(self.receiver_pool.as_ref())
            .collect()
    }
}

/// Why a Transfer cannot run as written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invalid {
    /// Condition reason.
    pub reason: &'static str,
    /// What to change.
    pub message: String,
}

fn invalid(reason: &'static str, message: String) -> Invalid {
    Invalid { reason, message }
}

/// The pools and the namespaces' consents a Transfer is checked against.
#[derive(Clone, Copy)]
pub struct Catalog<'a> {
    /// Pools by namespace and name.
    pub pools: &'a BTreeMap<Key, DtnPool>,
    /// DtnPoolBindings: which namespaces let which pools in.
    pub consents: &'a BTreeSet<Consent>,
}

/// Checks `t` against the pools and consents of `catalog`.
pub fn validate(t: &Transfer, catalog: Catalog<'_>) -> Result<Resolved, Invalid> {
    let ns = t.metadata.namespace.clone().unwrap_or_default();
    // Otherwise every write for it fails, and each plan hands it the slots
    // again: a Transfer that could never start would hold them for good.
    let name = t.metadata.name.as_deref().unwrap_or_default();
    if name.len() > MAX_NAME {
        return Err(Invalid {
            reason: reason::NAME_TOO_LONG,
            message: format!(
                "the name is {} characters; wirerate labels the Transfer's token Secret and grant with it, and a label value has at most {MAX_NAME}: recreate it with a shorter name",
                name.len()
            ),
        });
    }
    for role in [Role::Sender, Role::Receiver] {
        if let Some(bad) = t.pool_namespace(role).filter(|n| !namespace_name(n)) {
            return Err(invalid(
                reason::POOL_NOT_FOUND,
                format!(
                    "poolNamespace {bad:?} is not a namespace name: lower-case letters, digits and '-', starting and ending with a letter or digit"
                ),
            ));
        }
    }
    let src_key = (
        t.pool_namespace(Role::Sender)
            .unwrap_or_default()
            .to_owned(),
        t.spec.source.pool.clone(),
    );
    let src = pool(catalog, &src_key, &ns)?;
    under_roots(src, &src_key, &ns, &t.spec.source.path, false)?;

    let (receiver_pool, dst) = match &t.spec.destination.pool {
        Some(name) => {
            let key = (
                t.pool_namespace(Role::Receiver)
                    .unwrap_or_default()
                    .to_owned(),
                name.clone(),
            );
            let dst = pool(catalog, &key, &ns)?;
            under_roots(dst, &key, &ns, &t.spec.destination.path, true)?;
            (Some(key), Some(dst))
        }
        None => (None, None),
    };

    let pairs = pairs(t, dst.map(|d| (&receiver_pool, d)))?;
    let defaults = dst
        .map_or(&src.spec.tuning, |d| &d.spec.tuning)
        .or(&src.spec.tuning);
    let tuning = t.spec.tuning.clone().unwrap_or_default().or(&defaults);
    let striping = t
        .spec
        .striping
        .clone()
        .or_else(|| dst.and_then(|d| d.spec.striping.clone()));
    if let Some(problem) = tuning.problem(striping.as_ref()) {
        return Err(invalid(reason::INVALID_TUNING, problem));
    }
    // Checked here, before agents are placed, as the sender checks them.
    if let Some(Err(e)) = t.spec.filters.as_ref().map(|f| f.check()) {
        return Err(invalid(
            reason::INVALID_FILTERS,
            format!("spec.filters: {e}"),
        ));
    }
    mirror(t, dst.map(|d| (&receiver_pool, d)), pairs)?;
    keep(t, dst.map(|d| (&receiver_pool, d)))?;
    // Relays read the source from storage the sender's pool declares
    // shared: each reads what the sender would have.
    let relays = match src.spec.shared_storage {
        true => pairs - 1,
        false => 0,
    };
    Ok(Resolved {
        sender_pool: src_key,
        receiver_pool,
        tuning,
        striping,
        pairs,
        relays,
    })
}

/// The pairs `t` asks for, if it may have them: within the engine's bound
/// (the schema says so too, but an object stored before the bound, or
/// through an API server that does not check it, is checked here), and
/// above one only into a pool (`dst`, at its key) whose agents share
/// their storage.
fn pairs(t: &Transfer, dst: Option<(&Option<Key>, &DtnPool)>) -> Result<usize, Invalid> {
    let n = t.pairs();
    if !(1..=contract::MAX_PAIRS).contains(&n) {
        return Err(invalid(
            reason::INVALID_PAIRS,
            format!(
                "spec.pairs is {n}: a Transfer runs over 1 to {} pairs",
                contract::MAX_PAIRS
            ),
        ));
    }
    if n == 1 {
        if t.auto_pairs() {
            return Err(invalid(
                reason::INVALID_PAIRS,
                "spec.pairsPolicy is Auto but spec.pairs is 1: with Auto, pairs is the most pairs the Transfer may grow to; set it to 2 or more".to_owned(),
            ));
        }
        return Ok(1);
    }
    match dst {
        None => Err(invalid(
            reason::INVALID_PAIRS,
            format!(
                "spec.pairs is {n}, but the destination is an agent outside the cluster, which is one receiver: set pairs to 1 or send to a pool"
            ),
        )),
        Some((key, d)) if !d.spec.shared_storage => {
            let (ns, name) = key.clone().unwrap_or_default();
            Err(invalid(
                reason::STORAGE_NOT_SHARED,
                format!(
                    "spec.pairs is {n}, but DtnPool {ns}/{name} does not declare spec.sharedStorage: several receivers write one file only where every agent of the pool sees the same file system. Set sharedStorage: true on the pool if its storage is shared (NFS, Lustre, GPFS, CephFS), or set pairs to 1"
                ),
            ))
        }
        Some(_) => Ok(n as usize),
    }
}

/// Whether `t` may mirror into `dst` (at its key; None: an agent outside
/// the cluster, whose own `serve --allow-delete` decides) over `pairs`:
/// refused before anything moves, where its deletes would be.
fn mirror(
    t: &Transfer,
    dst: Option<(&Option<Key>, &DtnPool)>,
    pairs: usize,
) -> Result<(), Invalid> {
    if t.spec.mirror.is_none() {
        return Ok(());
    }
    if pairs > 1 {
        return Err(invalid(
            reason::DELETES_NOT_ALLOWED,
            format!(
                "spec.mirror is not done over several pairs yet, and spec.pairs is {pairs}: set pairs to 1 (the receivers share one root, so the result is the same)"
            ),
        ));
    }
    match dst {
        Some((key, d)) if !d.spec.allow_deletes => {
            let (ns, name) = key.clone().unwrap_or_default();
            Err(invalid(
                reason::DELETES_NOT_ALLOWED,
                format!(
                    "spec.mirror deletes at the destination, and DtnPool {ns}/{name} does not allow deletes: its admin may set spec.allowDeletes: true, or remove spec.mirror"
                ),
            ))
        }
        _ => Ok(()),
    }
}

/// Whether what `t` keeps of each file can be kept at `dst` (at its key;
/// None: an agent outside the cluster, whose own flags decide): its id
/// maps are maps, none gives root's id (no pool sets it), and owners
/// go only into a pool whose agents may set them.
fn keep(t: &Transfer, dst: Option<(&Option<Key>, &DtnPool)>) -> Result<(), Invalid> {
    let Some(k) = &t.spec.keep else {
        return Ok(());
    };
    if let Err(e) = k.keeping() {
        return Err(invalid(reason::INVALID_KEEP, format!("spec.keep.{e}")));
    }
    if !k.owner {
        return Ok(());
    }
    if k.maps_to_root() {
        return Err(invalid(
            reason::INVALID_KEEP,
            "spec.keep maps an id to root's (0), and no pool gives files root's owner or group: map it to another id".to_owned(),
        ));
    }
    match dst {
        Some((key, d)) if !d.gives_chown() => {
            let (ns, name) = key.clone().unwrap_or_default();
            Err(invalid(
                reason::INVALID_KEEP,
                format!(
                    "spec.keep.owner needs agents that may change owners, and DtnPool {ns}/{name} does not add the CHOWN, FOWNER and DAC_OVERRIDE capabilities (spec.securityContext.addCapabilities): its admin may add them, or leave owner out"
                ),
            ))
        }
        _ => Ok(()),
    }
}

/// Whether `pool` (at `key`) may run Transfers of namespace `ns`: its own, or
/// one the pool offers to serve and that consented with a DtnPoolBinding.
pub fn serves(pool: &DtnPool, key: &Key, ns: &str, consents: &BTreeSet<Consent>) -> bool {
    key.0 == ns
        || (pool.spec.allowed_namespaces.iter().any(|a| a == ns)
            && consents.contains(&Consent {
                namespace: ns.to_owned(),
                pool_namespace: key.0.clone(),
                pool: key.1.clone(),
            }))
}

fn pool<'a>(catalog: Catalog<'a>, key: &Key, ns: &str) -> Result<&'a DtnPool, Invalid> {
    let p = catalog.pools.get(key).ok_or_else(|| {
        invalid(
            reason::POOL_NOT_FOUND,
            format!(
                "DtnPool {}/{} does not exist: create it or fix the pool name",
                key.0, key.1
            ),
        )
    })?;
    if key.0 != ns && !p.spec.allowed_namespaces.iter().any(|a| a == ns) {
        return Err(invalid(
            reason::NAMESPACE_NOT_ALLOWED,
            format!(
                "DtnPool {}/{} does not serve namespace {ns}: add it to the pool's allowedNamespaces",
                key.0, key.1
            ),
        ));
    }
    if !serves(p, key, ns, catalog.consents) {
        return Err(invalid(
            reason::NAMESPACE_NOT_BOUND,
            format!(
                "namespace {ns} has not consented to DtnPool {}/{}: someone with rights in {ns} creates a DtnPoolBinding there with spec.poolNamespace {} and spec.pool {}",
                key.0, key.1, key.0, key.1
            ),
        ));
    }
    Ok(p)
}

/// The allowed root holding `path`, if any.
pub fn root_of<'a>(pool: &'a DtnPool, path: &str) -> Option<&'a str> {
    pool.spec
        .allowed_roots
        .iter()
        .map(|r| r.trim_end_matches('/'))
        .filter(|r| path.len() > r.len() && path.starts_with(r) && path.as_bytes()[r.len()] == b'/')
        .max_by_key(|r| r.len())
}

/// The host's own directories, which no pool mounts unless the admin
/// allows them by name (`--allowed-host-paths`): with them an agent could
/// read the node's credentials or write its binaries.
const SYSTEM_DIRS: &[&str] = &[
    "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64", "/proc", "/root", "/run",
    "/sbin", "/sys", "/usr", "/var",
];

/// Why `pool` may not mount its host paths, if it may not: each must lie
/// at or under one of `allowed` (the admin's list); with no list, it must
/// not be `/` nor at or under one of the host's system directories. A
/// path spelled with `..`, `.`, `//` or control characters is refused
/// either way, so that no spelling reaches around the list. The admission
/// policies check what the author may create; this holds where they are
/// missing too.
pub fn host_path_refused(pool: &DtnPool, allowed: &[String]) -> Option<String> {
    let under = |p: &str, dir: &str| {
        let dir = dir.trim_end_matches('/');
        p == dir || dir.is_empty() || p.strip_prefix(dir).is_some_and(|r| r.starts_with('/'))
    };
    for v in &pool.spec.volumes {
        let Some(p) = v.host_path.as_deref() else {
            continue;
        };
        let plain = p.starts_with('/')
            && !p.chars().any(char::is_control)
            && !p
                .split('/')
                .skip(1)
                .any(|s| s.is_empty() || s == "." || s == "..")
            || p == "/";
        let ok = plain
            && if allowed.is_empty() {
                p != "/" && !SYSTEM_DIRS.iter().any(|d| under(p, d))
            } else {
                allowed.iter().any(|a| under(p, a))
            };
        if !ok {
            let rule = if allowed.is_empty() {
                "the host's root and system directories are not allowed; an admin may allow host paths by name with the operator's --allowed-host-paths".to_owned()
            } else {
                format!(
                    "the operator allows host paths under {} only",
                    allowed.join(", ")
                )
            };
            return Some(format!("volume {} mounts host path {p:?}: {rule}", v.name));
        }
    }
    None
}

/// Whether `ns` is a namespace name (a DNS-1123 label), as admission
/// requires of poolNamespace.
pub fn namespace_name(ns: &str) -> bool {
    let b = ns.as_bytes();
    let inner = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    (1..=63).contains(&b.len())
        && b.first().is_some_and(inner)
        && b.last().is_some_and(inner)
        && b.iter().all(|c| inner(c) || *c == b'-')
}

fn under_roots(
    p: &DtnPool,
    key: &Key,
    tenant: &str,
    path: &str,
    writes: bool,
) -> Result<(), Invalid> {
    // As admission: a NUL is no file name's, a newline forges log lines.
    if path.chars().any(char::is_control) {
        return Err(invalid(
            reason::PATH_NOT_ALLOWED,
            format!(
                "{path:?}: a path must not contain control characters (NUL, newline, any below 0x20, or DEL)"
            ),
        ));
    }
    // Admission refuses these spellings too; a Transfer stored before that
    // rule, or written around it, is refused here.
    if !plain_path(path) {
        return Err(invalid(
            reason::PATH_NOT_ALLOWED,
            format!(
                "{path}: a path must be spelled plainly, without '//', '/./' or a trailing '/'"
            ),
        ));
    }
    let Some(root) = root_of(p, path) else {
        return Err(invalid(
            reason::PATH_NOT_ALLOWED,
            format!(
                "{path} is not under any allowedRoots of DtnPool {}/{} ({}): use a path beneath one of them",
                key.0,
                key.1,
                p.spec.allowed_roots.join(", ")
            ),
        ));
    };
    let read_only = p.spec.volumes.iter().any(|v| {
        let mount = v.mount_path.trim_end_matches('/');
        v.read_only && (root == mount || root.starts_with(&format!("{mount}/")))
    });
    // Tenants of a shared pool write each in their own subtree.
    if writes && tenant != key.0 {
        let mine = wirerate_crds::pool::tenant_roots(p, tenant);
        if !mine
            .iter()
            .any(|r| path.starts_with(r.as_str()) && path.as_bytes().get(r.len()) == Some(&b'/'))
        {
            return Err(invalid(
                reason::PATH_NOT_ALLOWED,
                format!(
                    "{path}: namespace {tenant} writes on DtnPool {}/{} only under its own subtree ({}), so tenants sharing the pool cannot overwrite one another's files",
                    key.0,
                    key.1,
                    mine.join(", ")
                ),
            ));
        }
    }
    if writes && read_only {
        return Err(invalid(
            reason::PATH_NOT_ALLOWED,
            format!(
                "{path} is on a read-only volume of DtnPool {}/{}: write to another pool",
                key.0, key.1
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use wirerate_crds::Tuning;
    use wirerate_crds::fixtures::{PoolBuilder, TransferBuilder};

    pub(crate) fn pool(name: &str, root: &str) -> DtnPool {
        PoolBuilder::new(name, root)
            .namespace("data")
            .uid(format!("uid-{name}"))
            .tuning(Tuning {
                block_size: Some(16 << 20),
                streams: Some(4),
                ..Default::default()
            })
            .build()
    }

    pub(crate) fn pools() -> BTreeMap<Key, DtnPool> {
        [pool("src", "/in"), pool("dst", "/out")]
            .into_iter()
            .map(|p| (("data".to_owned(), p.metadata.name.clone().unwrap()), p))
            .collect()
    }

    /// `t` checked against [`pools`], with no consents.
    pub(crate) fn check(t: &Transfer) -> Result<Resolved, Invalid> {
        validate(
            t,
            Catalog {
                pools: &pools(),
                consents: &BTreeSet::new(),
            },
        )
    }

    /// `t` checked against [`pools`] whose receiving pool declares shared storage.
    pub(crate) fn check_shared(t: &Transfer) -> Result<Resolved, Invalid> {
        let mut pools = pools();
        for p in pools.values_mut() {
            p.spec.shared_storage = true;
        }
        validate(
            t,
            Catalog {
                pools: &pools,
                consents: &BTreeSet::new(),
            },
        )
    }

    // A mirror into a pool that does not allow deletes, or over several
    // pairs, is refused before anything moves, saying what to change.
    #[test]
    fn a_mirror_needs_a_pool_that_allows_deletes_and_one_pair() {
        let mut t = transfer("t", "/in/a", "/out/a");
        t.spec.mirror = Some(wirerate_crds::transfer::Guard::default());
        let e = check(&t).unwrap_err();
        assert_eq!(e.reason, reason::DELETES_NOT_ALLOWED);
        assert!(
            e.message.contains("data/dst does not allow deletes"),
            "{}",
            e.message
        );
        let mut allowing = pools();
        for p in allowing.values_mut() {
            p.spec.allow_deletes = true;
            p.spec.shared_storage = true;
        }
        let at = |t: &Transfer| {
            validate(
                t,
                Catalog {
                    pools: &allowing,
                    consents: &BTreeSet::new(),
                },
            )
        };
        assert!(at(&t).is_ok());
        t.spec.pairs = Some(2);
        let e = at(&t).unwrap_err();
        assert_eq!(e.reason, reason::DELETES_NOT_ALLOWED);
        assert!(e.message.contains("several pairs"), "{}", e.message);
    }

    // Owners kept only into a pool that may set them, never mapped to
    // root's, and maps that are maps.
    #[test]
    fn keeping_owners_needs_chown_and_no_map_to_root() {
        use wirerate_crds::pool::{AgentSecurityContext, FileCapability};
        use wirerate_crds::transfer::{IdPair, KeepSpec};
        let mut t = transfer("t", "/in/a", "/out/a");
        t.spec.keep = Some(KeepSpec {
            xattrs: true,
            ..KeepSpec::default()
        });
        assert!(check(&t).is_ok(), "attributes need nothing of the pool");
        t.spec.keep.as_mut().unwrap().owner = true;
        let e = check(&t).unwrap_err();
        assert_eq!(e.reason, reason::INVALID_KEEP);
        assert!(
            e.message.contains("does not add the CHOWN, FOWNER"),
            "{}",
            e.message
        );
        let mut chown = pools();
        for p in chown.values_mut() {
            p.spec.security_context = Some(AgentSecurityContext {
                add_capabilities: vec![
                    FileCapability::CHOWN,
                    FileCapability::FOWNER,
                    FileCapability::DAC_OVERRIDE,
                ],
                ..Default::default()
            });
        }
        let at = |t: &Transfer| {
            validate(
                t,
                Catalog {
                    pools: &chown,
                    consents: &BTreeSet::new(),
                },
            )
        };
        assert!(at(&t).is_ok());
        let k = t.spec.keep.as_mut().unwrap();
        k.gid_map = vec![IdPair { from: 100, to: 0 }];
        let e = at(&t).unwrap_err();
        assert!(e.message.contains("root's (0)"), "{}", e.message);
        let k = t.spec.keep.as_mut().unwrap();
        k.gid_map = vec![IdPair { from: 1, to: 2 }, IdPair { from: 1, to: 3 }];
        let e = at(&t).unwrap_err();
        assert!(
            e.message.contains("gidMap: 1 is mapped twice"),
            "{}",
            e.message
        );
    }

    // Issue 34's bad input: a pair count out of bounds, and several pairs
    // into storage not declared shared, each refused naming the field.
    #[test]
    fn pairs_are_bounded_and_need_shared_storage_above_one() {
        let mut t = transfer("t", "/in/a", "/out/a");
        assert_eq!(check(&t).unwrap().pairs, 1, "unset is one pair");
        for bad in [0, -2, contract::MAX_PAIRS + 1] {
            t.spec.pairs = Some(bad);
            let e = check_shared(&t).unwrap_err();
            assert_eq!(e.reason, reason::INVALID_PAIRS, "{bad}");
            assert!(
                e.message.contains(&format!("spec.pairs is {bad}")),
                "{}",
                e.message
            );
        }
        t.spec.pairs = Some(3);
        let e = check(&t).unwrap_err();
        assert_eq!(e.reason, reason::STORAGE_NOT_SHARED);
        assert!(
            e.message
                .contains("data/dst does not declare spec.sharedStorage"),
            "{}",
            e.message
        );
        assert_eq!(check_shared(&t).unwrap().pairs, 3);
        // Relays, one per pair but the sender's, only from a sending
        // pool that declares shared storage too.
        assert_eq!(check_shared(&t).unwrap().relays, 2);
        let mut pools = pools();
        pools
            .get_mut(&("data".to_owned(), "dst".to_owned()))
            .unwrap()
            .spec
            .shared_storage = true;
        let catalog = Catalog {
            pools: &pools,
            consents: &BTreeSet::new(),
        };
        assert_eq!(validate(&t, catalog).unwrap().relays, 0);
        t.spec.pairs = Some(contract::MAX_PAIRS);
        assert!(check_shared(&t).is_ok());

        // Toward an agent outside the cluster: one receiver, one pair.
        let mut ext = t.clone();
        ext.spec.pairs = Some(2);
        ext.spec.destination.pool = None;
        ext.spec.destination.external = Some(wirerate_crds::transfer::External {
            address: "dtn.example.org:7700".into(),
            token_secret: "tok".into(),
        });
        let e = check_shared(&ext).unwrap_err();
        assert_eq!(e.reason, reason::INVALID_PAIRS);
        assert!(e.message.contains("outside the cluster"), "{}", e.message);

        // pairsPolicy Auto: pairs is its bound, 2 or more; it may start
        // on one receiver.
        let mut auto = t.clone();
        auto.spec.pairs = Some(1);
        auto.spec.pairs_policy = Some(wirerate_crds::transfer::PairsPolicy::Auto);
        let e = check_shared(&auto).unwrap_err();
        assert_eq!(e.reason, reason::INVALID_PAIRS);
        assert!(
            e.message.contains("spec.pairsPolicy is Auto"),
            "{}",
            e.message
        );
        auto.spec.pairs = Some(4);
        assert_eq!(check_shared(&auto).unwrap().pairs, 4);
    }

    pub(crate) fn transfer(name: &str, from: &str, to: &str) -> Transfer {
        TransferBuilder::new(name, from, to)
            .stored_in("data")
            .max_failovers(2)
            .build()
    }

    #[test]
    fn a_name_too_long_to_label_with_is_refused() {
        let ok = transfer(&"a".repeat(MAX_NAME), "/in/a", "/out/a");
        assert!(check(&ok).is_ok());
        let long = transfer(&"a".repeat(MAX_NAME + 1), "/in/a", "/out/a");
        let e = check(&long).unwrap_err();
        assert_eq!(e.reason, reason::NAME_TOO_LONG);
        assert!(e.message.contains("64 characters"), "{}", e.message);
    }

    #[test]
    fn resolves_pools_and_merges_tuning() {
        let mut t = transfer("t", "/in/a", "/out/a");
        t.spec.tuning = Some(Tuning {
            streams: Some(8),
            ..Default::default()
        });
        let r = check(&t).unwrap();
        assert_eq!(r.tuning.streams, Some(8));
        assert_eq!(r.tuning.block_size, Some(16777216));
        assert_eq!(r.receiver_pool, Some(("data".into(), "dst".into())));
    }

    /// Encryption is not a default a Transfer overrides: the strictest
    /// of the Transfer's and both pools' holds, so a pool that requires
    /// it holds every Transfer to or from it to TLS.
    #[test]
    fn a_pool_that_requires_encryption_holds_every_transfer_to_it() {
        use wirerate_crds::tuning::Encryption;
        let with = |pool: &str, e: Encryption| {
            let mut pools = pools();
            pools
                .get_mut(&("data".to_owned(), pool.to_owned()))
                .unwrap()
                .spec
                .tuning
                .encryption = Some(e);
            pools
        };
        let mut t = transfer("t", "/in/a", "/out/a");
        t.spec.tuning = Some(Tuning {
            encryption: Some(Encryption::None),
            ..Default::default()
        });
        for (pool, floor) in [
            ("dst", Encryption::Required),
            ("src", Encryption::Preferred),
        ] {
            let pools = with(pool, floor);
            let catalog = Catalog {
                pools: &pools,
                consents: &BTreeSet::new(),
            };
            let r = validate(&t, catalog).unwrap();
            assert_eq!(r.tuning.encryption(), floor, "{pool} pool at {floor}");
        }
        // A Transfer may ask for more than its pools.
        t.spec.tuning.as_mut().unwrap().encryption = Some(Encryption::Required);
        assert_eq!(check(&t).unwrap().tuning.encryption(), Encryption::Required);
        assert_eq!(
            check(&transfer("t", "/in/a", "/out/a"))
                .unwrap()
                .tuning
                .encryption(),
            Encryption::None
        );
    }

    #[test]
    fn refuses_with_a_reason_and_what_to_change() {
        let e = check(&transfer("t", "/in/a", "/elsewhere/a")).unwrap_err();
        assert_eq!(e.reason, reason::PATH_NOT_ALLOWED);
        assert!(e.message.contains("/out"), "{}", e.message);

        // A root is a directory, not a prefix: /input is not under /in.
        let e = check(&transfer("t", "/input/a", "/out/a")).unwrap_err();
        assert_eq!(e.reason, reason::PATH_NOT_ALLOWED);

        let mut t = transfer("t", "/in/a", "/out/a");
        t.spec.destination.pool = Some("nope".into());
        assert_eq!(check(&t).unwrap_err().reason, reason::POOL_NOT_FOUND);

        let mut t = transfer("t", "/in/a", "/out/a");
        t.metadata.namespace = Some("other".into());
        t.spec.source.pool_namespace = Some("data".into());
        t.spec.destination.pool_namespace = Some("data".into());
        let e = check(&t).unwrap_err();
        assert_eq!(e.reason, reason::NAMESPACE_NOT_ALLOWED);
        assert!(e.message.contains("allowedNamespaces"));

        let mut t = transfer("t", "/in/a", "/out/a");
        t.spec.striping = Some(Striping {
            stripe_count: 4,
            stripe_size: 3 * 1024 * 1024,
        });
        assert_eq!(check(&t).unwrap_err().reason, reason::INVALID_TUNING);

        let mut t = transfer("t", "/in/a", "/out/a");
        t.spec.filters = Some(wirerate_crds::tuning::Filters {
            min_size: Some(2),
            max_size: Some(1),
            ..Default::default()
        });
        let e = check(&t).unwrap_err();
        assert_eq!(e.reason, reason::INVALID_FILTERS);
        assert!(
            e.message.starts_with("spec.filters: minSize (2)"),
            "{}",
            e.message
        );
    }

    #[test]
    fn other_spellings_of_a_path_are_refused() {
        for (from, to) in [
            ("/in/a/", "/out/a"),
            ("/in/a", "/out//a"),
            ("/in/./a", "/out/a"),
        ] {
            let e = check(&transfer("t", from, to)).unwrap_err();
            assert_eq!(e.reason, reason::PATH_NOT_ALLOWED);
            assert!(e.message.contains("plainly"), "{}", e.message);
        }
    }

    #[test]
    fn a_read_only_volume_is_found_whatever_its_mount_path_ends_with() {
        let mut pools = pools();
        let dst = pools
            .get_mut(&("data".to_owned(), "dst".to_owned()))
            .unwrap();
        dst.spec.volumes[0].mount_path = "/out/".into();
        dst.spec.volumes[0].read_only = true;
        let e = validate(
            &transfer("t", "/in/a", "/out/a"),
            Catalog {
                pools: &pools,
                consents: &BTreeSet::new(),
            },
        )
        .unwrap_err();
        assert!(e.message.contains("read-only"), "{}", e.message);
    }

    #[test]
    fn another_namespace_is_served_only_when_the_pool_offers_and_the_namespace_consents() {
        let mut t = transfer("t", "/in/a", "/out/other/a");
        t.metadata.namespace = Some("other".into());
        t.spec.source.pool_namespace = Some("data".into());
        t.spec.destination.pool_namespace = Some("data".into());
        let mut offered = pools();
        for p in offered.values_mut() {
            p.spec.allowed_namespaces = vec!["other".into()];
        }
        let consent = |pool: &str| Consent {
            namespace: "other".into(),
            pool_namespace: "data".into(),
            pool: pool.into(),
        };
        let none = BTreeSet::new();
        let at = |consents| Catalog {
            pools: &offered,
            consents,
        };

        // The pool's offer alone is not enough: the namespace has not agreed.
        let e = validate(&t, at(&none)).unwrap_err();
        assert_eq!(e.reason, reason::NAMESPACE_NOT_BOUND);
        assert!(e.message.contains("DtnPoolBinding"), "{}", e.message);

        // Consent to one pool does not extend to the other.
        let only_src = BTreeSet::from([consent("src")]);
        let e = validate(&t, at(&only_src)).unwrap_err();
        assert_eq!(e.reason, reason::NAMESPACE_NOT_BOUND);
        assert!(e.message.contains("data/dst"), "{}", e.message);

        let both = BTreeSet::from([consent("src"), consent("dst")]);
        assert!(validate(&t, at(&both)).is_ok());

        // Consent without the pool's offer does not let a namespace in either.
        let plain = pools();
        let e = validate(
            &t,
            Catalog {
                pools: &plain,
                consents: &both,
            },
        )
        .unwrap_err();
        assert_eq!(e.reason, reason::NAMESPACE_NOT_ALLOWED);
    }

    // Found against a real API server without the CRDs' newer rules:
    // these got through, so the operator refuses them itself.
    #[test]
    fn control_characters_and_bad_namespace_names_are_refused() {
        for bad in ["/in/a\0b", "/in/a\nb", "/in/\u{1f}", "/in/a\u{7f}"] {
            let e = check(&transfer("t", bad, "/out/a")).unwrap_err();
            assert_eq!(e.reason, reason::PATH_NOT_ALLOWED, "{bad:?}");
            assert!(
                e.message.contains("must not contain control characters"),
                "{}",
                e.message
            );
            let e = check(&transfer("t", "/in/a", bad)).unwrap_err();
            assert_eq!(e.reason, reason::PATH_NOT_ALLOWED, "{bad:?}");
        }
        for bad in ["Not_A_NS", "-a", "a-", "a.b", ""] {
            let mut t = transfer("t", "/in/a", "/out/a");
            t.spec.destination.pool_namespace = Some(bad.into());
            let e = check(&t).unwrap_err();
            assert!(
                e.message.contains("is not a namespace name"),
                "{bad}: {}",
                e.message
            );
        }
        assert!(
            namespace_name("data") && namespace_name("a-1") && !namespace_name(&"a".repeat(64))
        );
    }

    // Found on an API server without the admission policies: a user who
    // may create only DtnPools got agents mounting the host's `/`.
    #[test]
    fn host_paths_outside_what_the_admin_allowed_are_refused() {
        let with = |path: &str| {
            let mut p = pool("src", "/in");
            p.spec.volumes[0].host_path = Some(path.into());
            p.spec.volumes[0].claim_name = None;
            p
        };
        for bad in [
            "/",
            "/etc",
            "/etc/kubernetes",
            "/var/lib/kubelet",
            "/proc/1",
            "/lustre/../etc",
            "/lustre//x",
            "/lustre/./x",
        ] {
            let why = host_path_refused(&with(bad), &[]).unwrap_or_else(|| panic!("{bad} allowed"));
            assert!(why.contains("--allowed-host-paths"), "{why}");
        }
        for ok in ["/lustre", "/data/in", "/mnt/scratch", "/variety"] {
            assert_eq!(host_path_refused(&with(ok), &[]), None, "{ok}");
        }
        let admin = ["/lustre".to_owned(), "/var/dtn/".to_owned()];
        for ok in ["/lustre", "/lustre/a", "/var/dtn", "/var/dtn/x"] {
            assert_eq!(host_path_refused(&with(ok), &admin), None, "{ok}");
        }
        for bad in ["/lustre2", "/data", "/var", "/"] {
            let why =
                host_path_refused(&with(bad), &admin).unwrap_or_else(|| panic!("{bad} allowed"));
            assert!(why.contains("under /lustre, /var/dtn/ only"), "{why}");
        }
    }

    // Found against a real API server: a namespace consenting to a shared
    // pool could overwrite another namespace's landed files.
    #[test]
    fn a_tenant_of_a_shared_pool_writes_only_in_its_own_subtree() {
        let mut offered = pools();
        for p in offered.values_mut() {
            p.spec.allowed_namespaces = vec!["a".into(), "b".into()];
        }
        let consents: BTreeSet<Consent> = ["a", "b"]
            .iter()
            .flat_map(|ns| {
                ["src", "dst"].map(|pool| Consent {
                    namespace: (*ns).into(),
                    pool_namespace: "data".into(),
                    pool: pool.into(),
                })
            })
            .collect();
        let from = |ns: &str, to: &str| {
            let mut t = transfer("t", "/in/a", to);
            t.metadata.namespace = Some(ns.into());
            t.spec.source.pool_namespace = Some("data".into());
            t.spec.destination.pool_namespace = Some("data".into());
            validate(
                &t,
                Catalog {
                    pools: &offered,
                    consents: &consents,
                },
            )
        };
        assert!(from("a", "/out/a/x").is_ok());
        assert!(from("b", "/out/b/x").is_ok());
        for (ns, into) in [
            ("a", "/out/b/x"),
            ("a", "/out/x"),
            ("b", "/out/a/x"),
            ("a", "/out/ab/x"),
        ] {
            let e = from(ns, into).unwrap_err();
            assert_eq!(e.reason, reason::PATH_NOT_ALLOWED, "{ns} into {into}");
            assert!(e.message.contains("own subtree (/out/"), "{}", e.message);
        }
        // The pool's own namespace keeps the whole root.
        assert!(check(&transfer("t", "/in/a", "/out/b/x")).is_ok());
    }
}
