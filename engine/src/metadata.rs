//! What a send keeps of each file beyond its data, mode and times: its
//! owner and group (through a map, for sites whose ids differ) and its
//! extended attributes (POSIX ACLs among them). I/O-free: the sender's
//! shell reads them (`sender::metadata`), the receiver's sets them as it
//! publishes (`receiver::dest`), and this decides what may go.

use std::fmt;
use std::str::FromStr;

use crate::wire::Meta;

/// The attribute that holds a file's access ACL.
pub const ACL_ACCESS: &str = "system.posix_acl_access";
/// The attribute that holds a directory's default ACL.
pub const ACL_DEFAULT: &str = "system.posix_acl_default";

/// Whether the attribute `name` holds a POSIX ACL.
pub fn is_acl(name: &str) -> bool {
    name == ACL_ACCESS || name == ACL_DEFAULT
}

/// What a send keeps (`send --keep owner,xattrs,acls`). None of it by
/// default: owners mean little across sites whose ids differ, and a
/// receiver sets them only where its operator allows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Keep {
    /// Owner and group (the receiver needs `serve --keep-owners`).
    pub owner: bool,
    /// Extended attributes in the `user.` namespace.
    pub xattrs: bool,
    /// POSIX ACLs (`system.posix_acl_access`, `system.posix_acl_default`).
    pub acls: bool,
}

impl Keep {
    /// The spellings `--keep` takes.
    pub const NAMES: [&str; 3] = ["owner", "xattrs", "acls"];

    /// Whether it keeps anything.
    pub fn any(self) -> bool {
        self.owner || self.xattrs || self.acls
    }

    /// Whether the attribute `name` is one it keeps.
    pub fn keeps_xattr(self, name: &str) -> bool {
        (self.xattrs && name.starts_with("user.")) || (self.acls && is_acl(name))
    }
}

impl FromStr for Keep {
    type Err = String;

    /// A comma-separated list of `owner`, `xattrs` and `acls`, or `none`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut k = Self::default();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match part {
                "owner" => k.owner = true,
                "xattrs" => k.xattrs = true,
                "acls" => k.acls = true,
                "none" => {}
                other => {
                    return Err(format!(
                        "{other:?} is not something a send keeps: give a comma-separated list of {}, or none",
                        Self::NAMES.join(", ")
                    ));
                }
            }
        }
        Ok(k)
    }
}

impl fmt::Display for Keep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = [self.owner, self.xattrs, self.acls]
            .iter()
            .zip(Self::NAMES)
            .filter(|(on, _)| **on)
            .map(|(_, n)| n)
            .collect();
        match names.is_empty() {
            true => f.write_str("none"),
            false => f.write_str(&names.join(",")),
        }
    }
}

/// What a send keeps, and the id maps its owners go through.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Keeping {
    /// What it keeps.
    pub keep: Keep,
    /// Owner ids, sending site to receiving site.
    pub uids: IdMap,
    /// Group ids, likewise.
    pub gids: IdMap,
}

/// Most pairs one id map holds.
pub const MAX_ID_MAP: usize = 4096;

/// Ids of the sending site mapped to the receiving site's
/// (`--uid-map 1000:2000,1001:2001`); an id not in it stays as it is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IdMap(Vec<(u32, u32)>);

impl IdMap {
    /// The map of `pairs`, FROM and TO; refused if a FROM is there twice
    /// or there are more than `MAX_ID_MAP`.
    pub fn from_pairs(pairs: impl IntoIterator<Item = (u32, u32)>) -> Result<Self, String> {
        let mut out: Vec<(u32, u32)> = Vec::new();
        for (from, to) in pairs {
            if out.iter().any(|(f, _)| *f == from) {
                return Err(format!("{from} is mapped twice"));
            }
            if out.len() == MAX_ID_MAP {
                return Err(format!("more than {MAX_ID_MAP} ids mapped"));
            }
            out.push((from, to));
        }
        Ok(Self(out))
    }

    /// The id `id` maps to.
    pub fn map(&self, id: u32) -> u32 {
        self.0
            .iter()
            .find(|(from, _)| *from == id)
            .map_or(id, |(_, to)| *to)
    }
}

impl FromStr for IdMap {
    type Err = String;

    /// `FROM:TO` pairs, comma-separated; each FROM once.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut pairs: Vec<(u32, u32)> = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let parsed = part
                .split_once(':')
                .and_then(|(a, b)| Some((a.trim().parse().ok()?, b.trim().parse().ok()?)));
            let Some(pair) = parsed else {
                return Err(format!(
                    "{part:?} is not FROM:TO (two numeric ids, e.g. 1000:2000)"
                ));
            };
            pairs.push(pair);
        }
        Self::from_pairs(pairs)
    }
}

/// Whether a receiver sets the attribute `name` a sender sent: only
/// those a send keeps at all, whatever the sender says. Never
/// `security.*` (file capabilities, SELinux labels) or `trusted.*`: one
/// would hand a program privileges the receiver's operator never gave.
pub fn settable(name: &str) -> bool {
    name.starts_with("user.") || is_acl(name)
}

/// What a receiver does with a sent owner.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum OwnerPolicy {
    /// Leave every file owned by the receiver (the default).
    #[default]
    Ignore,
    /// Set the sent owner, except root's.
    Keep,
    /// Set the sent owner, root's too.
    KeepRoot,
}

/// Why a receiver did not set what was sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotKept {
    /// The receiver does not set owners.
    Owners,
    /// The owner or group is root's, which the receiver does not give.
    Root,
    /// An attribute outside what a send keeps.
    Attribute,
    /// An ACL, which the receiver does not set.
    Acls,
}

impl fmt::Display for NotKept {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Owners => {
                "owners not kept: this receiver does not set them (serve --keep-owners, as root or with CAP_CHOWN, CAP_FOWNER and CAP_DAC_OVERRIDE)"
            }
            Self::Root => {
                "owners not kept: the sender mapped them to root (uid or gid 0), which this receiver does not give (serve --allow-root-owner)"
            }
            Self::Attribute => {
                "an extended attribute outside user.* and POSIX ACLs was sent, and not set"
            }
            Self::Acls => {
                "ACLs not kept: this receiver does not set them (serve --keep-acls)"
            }
        })
    }
}

/// What of `meta` the receiver sets under `policy` (and `acls`: whether
/// it sets ACLs, which grant access to users the receiver's operator may
/// not expect), and what it leaves, saying why.
pub fn admitted(meta: Meta, policy: OwnerPolicy, acls: bool) -> (Meta, Vec<NotKept>) {
    let mut left = Vec::new();
    let owner = match (meta.owner, policy) {
        (None, _) => None,
        (Some(_), OwnerPolicy::Ignore) => {
            left.push(NotKept::Owners);
            None
        }
        (Some((0, _) | (_, 0)), OwnerPolicy::Keep) => {
            left.push(NotKept::Root);
            None
        }
        (Some(o), _) => Some(o),
    };
    let mut xattrs = Vec::with_capacity(meta.xattrs.len());
    for (name, value) in meta.xattrs {
        if !settable(&name) {
            push_once(&mut left, NotKept::Attribute);
        } else if is_acl(&name) && !acls {
            push_once(&mut left, NotKept::Acls);
        } else {
            xattrs.push((name, value));
        }
    }
    (Meta { owner, xattrs }, left)
}

fn push_once(left: &mut Vec<NotKept>, why: NotKept) {
    if !left.contains(&why) {
        left.push(why);
    }
}

/// The POSIX ACL `value` (as the kernel stores it in
/// `system.posix_acl_*`: a version, then tag, permissions and id for each
/// entry) with the ids of its named users and groups mapped; None if it
/// is not such a value.
pub fn map_acl(value: &[u8], uids: &IdMap, gids: &IdMap) -> Option<Vec<u8>> {
    const USER: u16 = 0x02;
    const GROUP: u16 = 0x08;
    let (head, entries) = value.split_first_chunk::<4>()?;
    if u32::from_le_bytes(*head) != 2 || entries.len() % 8 != 0 {
        return None;
    }
    let mut out = head.to_vec();
    for e in entries.chunks_exact(8) {
        let tag = u16::from_le_bytes([e[0], e[1]]);
        let id = u32::from_le_bytes([e[4], e[5], e[6], e[7]]);
        let id = match tag {
            USER => uids.map(id),
            GROUP => gids.map(id),
            _ => id,
        };
        out.extend_from_slice(&e[..4]);
        out.extend_from_slice(&id.to_le_bytes());
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keep_and_id_maps_parse_and_refuse_what_they_cannot_mean() {
        let k: Keep = "owner, acls".parse().unwrap();
        assert_eq!((k.owner, k.xattrs, k.acls), (true, false, true));
        assert_eq!(k.to_string(), "owner,acls");
        assert_eq!("none".parse::<Keep>().unwrap(), Keep::default());
        assert!(
            "owners"
                .parse::<Keep>()
                .unwrap_err()
                .contains("owner, xattrs, acls")
        );
        assert!(k.keeps_xattr(ACL_ACCESS) && !k.keeps_xattr("user.a"));
        let m: IdMap = "1000:2000, 5:0".parse().unwrap();
        assert_eq!((m.map(1000), m.map(5), m.map(7)), (2000, 0, 7));
        for bad in ["1000", "a:b", "1:2,1:3", "1:-2"] {
            assert!(bad.parse::<IdMap>().is_err(), "{bad}");
        }
    }

    #[test]
    fn a_receiver_sets_only_what_it_allows() {
        let sent = Meta {
            owner: Some((1000, 0)),
            xattrs: vec![
                ("user.origin".into(), b"x".to_vec()),
                (ACL_ACCESS.into(), vec![2, 0, 0, 0]),
                ("security.capability".into(), vec![1]),
                ("trusted.overlay".into(), vec![1]),
            ],
        };
        let (set, left) = admitted(sent.clone(), OwnerPolicy::Keep, true);
        assert_eq!(set.owner, None, "root's group is not given");
        assert_eq!(
            set.xattrs.iter().map(|x| x.0.as_str()).collect::<Vec<_>>(),
            ["user.origin", ACL_ACCESS]
        );
        assert_eq!(left, [NotKept::Root, NotKept::Attribute]);
        let (set, _) = admitted(sent.clone(), OwnerPolicy::KeepRoot, true);
        assert_eq!(set.owner, Some((1000, 0)));
        let (set, left) = admitted(sent, OwnerPolicy::Ignore, false);
        assert_eq!(set.owner, None);
        assert_eq!(left, [NotKept::Owners, NotKept::Acls, NotKept::Attribute]);
        assert_eq!(
            set.xattrs.iter().map(|x| x.0.as_str()).collect::<Vec<_>>(),
            ["user.origin"]
        );
    }

    #[test]
    fn an_acls_named_ids_go_through_the_maps() {
        let entry = |tag: u16, id: u32| {
            let mut e = tag.to_le_bytes().to_vec();
            e.extend_from_slice(&4u16.to_le_bytes());
            e.extend_from_slice(&id.to_le_bytes());
            e
        };
        let acl = |user: u32, group: u32| {
            let mut v = 2u32.to_le_bytes().to_vec();
            for e in [
                entry(1, u32::MAX),
                entry(2, user),
                entry(8, group),
                entry(0x20, u32::MAX),
            ] {
                v.extend(e);
            }
            v
        };
        let (uids, gids) = ("7:70".parse().unwrap(), "8:80".parse().unwrap());
        assert_eq!(map_acl(&acl(7, 8), &uids, &gids), Some(acl(70, 80)));
        assert_eq!(map_acl(&acl(9, 7), &uids, &gids), Some(acl(9, 7)));
        assert_eq!(map_acl(&[2, 0, 0, 0, 1], &uids, &gids), None);
        assert_eq!(map_acl(&[1, 0, 0, 0], &uids, &gids), None);
    }
}
