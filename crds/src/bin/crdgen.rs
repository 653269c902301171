//! Prints wirerate's CRDs as YAML (charts/wirerate/crds/ holds the output).
#![forbid(unsafe_code)]

fn main() {
    match wirerate_crds::crds_yaml() {
        Ok(yaml) => print!("{yaml}"),
        Err(e) => {
            eprintln!("crdgen: cannot render the CRDs: {e}");
            std::process::exit(2);
        }
    }
}
