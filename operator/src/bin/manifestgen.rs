//! Writes what is generated from the operator's and the CRDs' own types:
//! manifests/install.yaml, the chart's values, templates and CRDs, and the
//! admission policies. Run from anywhere in the repository; tests fail when
//! a committed copy differs from what this writes.
//!
//! `manifestgen --render-examples DIR` instead writes, for each example
//! DtnPool, the objects the operator renders for it (ServiceAccount, Roles,
//! Service, StatefulSet) to DIR/<pool>.yaml, for offline schema checks.
#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use wirerate_operator::{admission, install};

fn write(root: &Path, path: &str, text: &str) -> Result<()> {
    let p = root.join(path);
    if std::fs::read_to_string(&p).ok().as_deref() == Some(text) {
        return Ok(());
    }
    std::fs::write(&p, text).with_context(|| format!("writing {}", p.display()))?;
    println!("wrote {path}");
    Ok(())
}

/// Renders each manifests/examples/dtnpool-*.yaml as the operator would,
/// serving every namespace it offers.
fn render_examples(root: &Path, out: &Path) -> Result<()> {
    use wirerate_crds::DtnPool;
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let dir = root.join("manifests/examples");
    let mut n = 0;
    for e in std::fs::read_dir(&dir)? {
        let path = e?.path();
        let name = path
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        if !(name.starts_with("dtnpool-") && name.ends_with(".yaml")) {
            continue;
        }
        let pool: DtnPool = serde_yaml::from_str(&std::fs::read_to_string(&path)?)
            .with_context(|| format!("parsing {}", path.display()))?;
        let r = wirerate_operator::render::render(&pool, &pool.spec.allowed_namespaces);
        let mut docs = vec![
            serde_yaml::to_string(&r.service_account)?,
            serde_yaml::to_string(&r.role)?,
            serde_yaml::to_string(&r.role_binding)?,
            serde_yaml::to_string(&r.service)?,
            serde_yaml::to_string(&r.stateful_set)?,
        ];
        for (role, binding) in &r.remote {
            docs.push(serde_yaml::to_string(role)?);
            docs.push(serde_yaml::to_string(binding)?);
        }
        let text: String = docs.iter().map(|d| format!("---\n{d}")).collect();
        std::fs::write(out.join(&name), text)?;
        n += 1;
    }
    anyhow::ensure!(n > 0, "no dtnpool-*.yaml in {}", dir.display());
    println!("rendered {n} example pool(s) into {}", out.display());
    Ok(())
}

fn main() -> Result<()> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [] => {}
        [flag, dir] if flag == "--render-examples" => {
            return render_examples(&root, Path::new(dir));
        }
        _ => anyhow::bail!("usage: manifestgen [--render-examples DIR]"),
    }
    write(&root, "manifests/install.yaml", &install::install_yaml()?)?;
    write(
        &root,
        "charts/wirerate/crds/crds.yaml",
        &wirerate_crds::crds_yaml()?,
    )?;
    write(
        &root,
        "charts/wirerate/templates/admission-policy.yaml",
        &admission::policies_yaml()?,
    )?;
    for (path, text) in install::chart_files()? {
        write(&root, &format!("charts/wirerate/{path}"), &text)?;
    }
    Ok(())
}
