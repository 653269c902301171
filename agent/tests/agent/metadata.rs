//! What a send keeps beyond a file's data, mode and times (`--keep`),
//! between a real sender and receiver, as root: owners through the id
//! maps, where the receiver sets them (and root's only where it allows),
//! extended attributes in `user.`, POSIX ACLs; never `trusted.` or
//! `security.` attributes.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::common::*;
use wirerate_engine::metadata::{ACL_ACCESS, ACL_DEFAULT, Keep, OwnerPolicy};
use wirerate_engine::sender::{Keeping, send};

/// An access ACL: the owner rw, user 1001 r, the group r, the mask r,
/// others nothing (`setfacl -m u:1001:r`), as the kernel stores it.
fn acl() -> Vec<u8> {
    acl_of(1001, 0)
}

/// The same with the named user `user` and others' permissions `other`.
fn acl_of(user: u32, other: u16) -> Vec<u8> {
    let mut v = 2u32.to_le_bytes().to_vec();
    for (tag, perm, id) in [
        (0x01u16, 6u16, u32::MAX),
        (0x02, 4, user),
        (0x04, 4, u32::MAX),
        (0x10, 4, u32::MAX),
        (0x20, other, u32::MAX),
    ] {
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&perm.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    }
    v
}

fn xattr(path: &Path, name: &str) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; 4096];
    let n = rustix::fs::getxattr(path, name, &mut buf[..]).ok()?;
    buf.truncate(n);
    Some(buf)
}

fn set_xattr(path: &Path, name: &str, value: &[u8]) {
    rustix::fs::setxattr(path, name, value, rustix::fs::XattrFlags::empty())
        .unwrap_or_else(|e| panic!("setting {name} on {}: {e}", path.display()));
}

/// A source file owned by 1234:5678 with a user attribute, an ACL and a
/// trusted attribute (which no send carries).
fn source(dir: &Path) -> std::path::PathBuf {
    let src = dir.join("src");
    let f = src.join("frame.h5");
    write_file(&f, 70_000, 1);
    std::os::unix::fs::chown(&f, Some(1234), Some(5678)).unwrap();
    set_xattr(&f, "user.origin", b"telescope-3");
    set_xattr(&f, ACL_ACCESS, &acl());
    set_xattr(&f, "trusted.site", b"private");
    // Others may write it: the receiver's umask takes that away.
    let open = src.join("open.dat");
    write_file(&open, 10, 3);
    set_xattr(&open, ACL_ACCESS, &acl_of(1001, 6));
    // A directory with an owner, an attribute and a default ACL.
    let sub = src.join("sub");
    write_file(&sub.join("inner.bin"), 10, 2);
    std::os::unix::fs::chown(&sub, Some(1234), Some(5678)).unwrap();
    set_xattr(&sub, "user.kind", b"calibration");
    set_xattr(&sub, ACL_DEFAULT, &acl());
    src
}

fn keeping(uids: &str, gids: &str) -> Keeping {
    Keeping {
        keep: "owner,xattrs,acls".parse::<Keep>().unwrap(),
        uids: uids.parse().unwrap(),
        gids: gids.parse().unwrap(),
    }
}

#[test]
fn owners_attributes_and_acls_are_kept_where_the_receiver_allows() {
    if !require_root("keeping owners, attributes and ACLs") {
        return;
    }
    let dir = scratch("keep-metadata");
    let src = source(dir.path());
    for (policy, acls, uids, gids, owner) in [
        // Through the uid map, which names in ACLs go through too.
        (
            OwnerPolicy::Keep,
            true,
            "1234:4321,1001:2001",
            "",
            (4321, 5678),
        ),
        // A receiver that does not set owners or ACLs keeps its own.
        (OwnerPolicy::Ignore, false, "", "", (0, 0)),
        // Mapped to root's group: not given unless allowed.
        (OwnerPolicy::Keep, true, "", "5678:0", (0, 0)),
        (OwnerPolicy::KeepRoot, true, "", "5678:0", (1234, 0)),
    ] {
        let root = dir.path().join(format!("dst-{policy:?}-{acls}-{gids}"));
        std::fs::create_dir_all(&root).unwrap();
        let srv = server_with(&root, "127.0.0.1:0", |c| {
            c.owners = policy;
            c.acls = acls;
        });
        let mut cfg = send_cfg(srv.addr(), &src, "run");
        cfg.keeping = keeping(uids, gids);
        let s = send(&cfg).unwrap();
        assert!(s.ok, "{}", s.render());
        let got = root.join("run/frame.h5");
        let m = std::fs::metadata(&got).unwrap();
        assert_eq!((m.uid(), m.gid()), owner, "{policy:?} {uids} {gids}");
        assert_eq!(
            xattr(&got, "user.origin").as_deref(),
            Some(&b"telescope-3"[..])
        );
        let named = if uids.contains("1001:2001") {
            2001
        } else {
            1001
        };
        let want = acls.then(|| acl_of(named, 0));
        assert_eq!(xattr(&got, ACL_ACCESS), want, "{policy:?} {uids}");
        assert_eq!(xattr(&got, "trusted.site"), None, "trusted.* is never sent");
        assert_same(&src.join("frame.h5"), &got);
        let open = root.join("run/open.dat");
        let want = acls.then(|| acl_of(named, 4));
        assert_eq!(xattr(&open, ACL_ACCESS), want, "the umask holds");
        assert_eq!(std::fs::metadata(&open).unwrap().mode() & 0o777, 0o644);
        let sub = root.join("run/sub");
        let m = std::fs::metadata(&sub).unwrap();
        assert_eq!((m.uid(), m.gid()), owner, "the directory's");
        assert_eq!(
            xattr(&sub, "user.kind").as_deref(),
            Some(&b"calibration"[..])
        );
        assert_eq!(xattr(&sub, ACL_DEFAULT), acls.then(|| acl_of(named, 0)));
    }
    // A directory that was there before keeps what it had.
    let root = dir.path().join("dst-there");
    std::fs::create_dir_all(root.join("run/sub")).unwrap();
    let srv = server_with(&root, "127.0.0.1:0", |c| {
        c.owners = OwnerPolicy::Keep;
        c.acls = true;
    });
    let mut cfg = send_cfg(srv.addr(), &src, "run");
    cfg.keeping = keeping("", "");
    assert!(send(&cfg).unwrap().ok);
    let sub = root.join("run/sub");
    assert_eq!(std::fs::metadata(&sub).unwrap().uid(), 0);
    assert_eq!(xattr(&sub, "user.kind"), None);
    assert_eq!(xattr(&sub, ACL_DEFAULT), None);
    assert_eq!(
        std::fs::metadata(root.join("run/frame.h5")).unwrap().uid(),
        1234
    );
    // Without --keep, nothing of it goes.
    let root = dir.path().join("dst-plain");
    std::fs::create_dir_all(&root).unwrap();
    let srv = server_with(&root, "127.0.0.1:0", |c| c.owners = OwnerPolicy::KeepRoot);
    let s = send(&send_cfg(srv.addr(), &src, "run")).unwrap();
    assert!(s.ok, "{}", s.render());
    let got = root.join("run/frame.h5");
    assert_eq!(std::fs::metadata(&got).unwrap().uid(), 0);
    assert_eq!(xattr(&got, "user.origin"), None);
    assert_eq!(xattr(&got, ACL_ACCESS), None);
}

// The command line: --keep with maps, --keep-owners on the receiver.
#[test]
fn keep_on_the_command_line() {
    if !require_root("keeping owners from the command line") {
        return;
    }
    let s = setup("keep-cli", 10);
    let src = source(s.src.parent().unwrap());
    let port = free_port();
    let _srv = Proc(
        std::process::Command::new(BIN)
            .args([
                "serve",
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--keep-owners",
            ])
            .arg("--root")
            .arg(&s.root)
            .arg("--token-file")
            .arg(&s.token)
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_listening(port);
    let to = format!("127.0.0.1:{port}");
    let out = send_bin(
        &to,
        &["--quiet", "--keep", "owner,xattrs", "--uid-map", "1234:99"],
        &s.token,
        &src,
        "run",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got = s.root.join("run/frame.h5");
    assert_eq!(std::fs::metadata(&got).unwrap().uid(), 99);
    assert_eq!(
        xattr(&got, "user.origin").as_deref(),
        Some(&b"telescope-3"[..])
    );
    assert_eq!(xattr(&got, ACL_ACCESS), None, "acls were not asked for");
    let bad = send_bin(&to, &["--keep", "owners"], &s.token, &src, "run2");
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("owner, xattrs, acls"));
}

// A manifest whose attributes alone pass a frame's size is sent in
// frames that fit: 1,500 files of 3.5 KiB of attributes each once went
// in one 5 MiB frame, which the receiver refused.
#[test]
fn a_manifest_heavy_with_attributes_goes_in_frames_that_fit() {
    let dir = scratch("keep-heavy");
    let src = dir.path().join("src");
    let pad = vec![b'x'; 3500];
    for i in 0..1500 {
        let f = src.join(format!("f{i:04}"));
        write_file(&f, 1, i);
        set_xattr(&f, "user.pad", &pad);
    }
    let root = dir.path().join("dst");
    std::fs::create_dir_all(&root).unwrap();
    let srv = server(&root, wirerate_engine::io::IoMode::Async);
    let mut cfg = send_cfg(srv.addr(), &src, "run");
    cfg.keeping = keeping("", "");
    let s = send(&cfg).unwrap();
    assert!(s.ok, "{}", s.render());
    assert_eq!(s.files_ok, 1500);
    assert_eq!(xattr(&root.join("run/f1499"), "user.pad"), Some(pad));
}
