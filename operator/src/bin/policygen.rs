//! Prints the admission policies that hold wirerate to the RBAC escalation
//! rule (charts/wirerate/templates/admission-policy.yaml holds the output).
#![forbid(unsafe_code)]

fn main() {
    match wirerate_operator::admission::policies_yaml() {
        Ok(yaml) => print!("{yaml}"),
        Err(e) => {
            eprintln!("policygen: cannot render the policies: {e}");
            std::process::exit(2);
        }
    }
}
