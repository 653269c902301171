//! The flags reference, written from a clap `Command`: the same definition
//! `--help` prints, so a flag, default or environment variable the binary
//! takes is one the book names.

use std::fmt::Write as _;

use clap::{Arg, Command};

use crate::markdown::{cell, code};

/// The page for `cmd`: its own arguments, then one section per subcommand.
pub fn page(title: &str, intro: &str, mut cmd: Command) -> String {
    // Building sets each subcommand's full name ("wirerate-agent serve").
    cmd.build();
    let mut out = format!("# {title}\n\n{}\n\n", crate::GENERATED);
    if let Some(about) = cmd.get_long_about().or(cmd.get_about()) {
        let _ = write!(out, "{}\n\n", sentence(&about.to_string()));
    }
    let _ = write!(out, "{intro}\n\n");
    section(&mut out, &mut cmd);
    for sub in cmd.get_subcommands_mut() {
        if sub.is_hide_set() || sub.get_name() == "help" {
            continue;
        }
        let name = sub.get_bin_name().unwrap_or(sub.get_name()).to_string();
        let _ = write!(out, "## {name}\n\n");
        if let Some(about) = sub.get_long_about().or(sub.get_about()) {
            let _ = write!(out, "{}\n\n", cell(&sentence(&about.to_string())));
        }
        section(&mut out, sub);
    }
    out.truncate(out.trim_end().len());
    out.push('\n');
    out
}

/// `cmd`'s usage line and a table of its arguments (none when it has only
/// subcommands).
fn section(out: &mut String, cmd: &mut Command) {
    let args: Vec<&Arg> = cmd.get_arguments().filter(|a| shown(a)).collect();
    if args.is_empty() {
        return;
    }
    let rows: Vec<String> = args.iter().map(|a| row(a)).collect();
    let usage = cmd.render_usage().to_string();
    let _ = write!(out, "```text\n{}\n```\n\n", usage.trim());
    out.push_str("| argument | default | environment | meaning |\n|---|---|---|---|\n");
    for r in rows {
        out.push_str(&r);
    }
    out.push('\n');
}

/// Whether the reference lists `arg`: not hidden, and not the `--help` and
/// `--version` every command has.
fn shown(arg: &Arg) -> bool {
    !arg.is_hide_set() && !matches!(arg.get_id().as_str(), "help" | "version")
}

fn row(arg: &Arg) -> String {
    let takes_value = arg.get_action().takes_values();
    let value = arg
        .get_value_names()
        .map(|v| v.iter().map(|n| format!("<{n}>")).collect::<Vec<_>>())
        .unwrap_or_else(|| vec![format!("<{}>", arg.get_id().as_str().to_uppercase())])
        .join(" ");
    let name = match (arg.get_long(), arg.get_short()) {
        (Some(l), Some(s)) => format!("-{s}, --{l}"),
        (Some(l), None) => format!("--{l}"),
        (None, Some(s)) => format!("-{s}"),
        (None, None) => value.clone(),
    };
    let name = if takes_value && arg.get_long().or(arg.get_short().map(|_| "")).is_some() {
        format!("{name} {value}")
    } else {
        name
    };
    let default = if takes_value {
        let d: Vec<String> = arg
            .get_default_values()
            .iter()
            .map(|v| v.to_string_lossy().into_owned())
            .filter(|v| !v.is_empty())
            .collect();
        if d.is_empty() {
            String::new()
        } else {
            code(&d.join(","))
        }
    } else {
        String::new()
    };
    let env = arg
        .get_env()
        .map(|e| code(&e.to_string_lossy()))
        .unwrap_or_default();
    format!(
        "| {} | {default} | {env} | {} |\n",
        code(&name),
        cell(&meaning(arg, takes_value))
    )
}

/// The help text, then what it does not say: the values it takes, and
/// whether it is required.
fn meaning(arg: &Arg, takes_value: bool) -> String {
    let mut text = sentence(
        &arg.get_long_help()
            .or(arg.get_help())
            .map(|h| h.to_string())
            .unwrap_or_default(),
    );
    let values: Vec<String> = arg
        .get_possible_values()
        .iter()
        .filter(|v| !v.is_hide_set())
        .map(|v| format!("`{}`", v.get_name()))
        .collect();
    if takes_value && !values.is_empty() {
        let _ = write!(text, " One of {}.", values.join(", "));
    }
    if arg.is_required_set() {
        text.push_str(" Required.");
    }
    text
}

/// `text` ending as a sentence does: clap drops the full stop of a
/// one-sentence doc comment, and the reference adds sentences after it.
fn sentence(text: &str) -> String {
    let t = text.trim_end();
    if t.is_empty() || t.ends_with(['.', '!', '?']) {
        t.to_string()
    } else {
        format!("{t}.")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every argument of every command `cmd` has, as `(command, id)`.
    fn arguments(cmd: &mut Command) -> Vec<(String, String)> {
        cmd.build();
        let mut all: Vec<(String, String)> = cmd
            .get_arguments()
            .filter(|a| shown(a))
            .map(|a| (cmd.get_name().to_string(), long_or_id(a)))
            .collect();
        for sub in cmd.get_subcommands_mut() {
            if sub.get_name() == "help" {
                continue;
            }
            for a in sub.get_arguments().filter(|a| shown(a)) {
                all.push((sub.get_name().to_string(), long_or_id(a)));
            }
        }
        all
    }

    fn long_or_id(a: &Arg) -> String {
        a.get_long()
            .map(|l| format!("--{l}"))
            .unwrap_or_else(|| format!("<{}>", a.get_id().as_str().to_uppercase()))
    }

    #[test]
    fn every_flag_of_every_agent_command_is_in_its_section() {
        let text = page("t", "i", wirerate_agent::cli::command());
        let args = arguments(&mut wirerate_agent::cli::command());
        assert!(args.len() > 40, "only {} arguments found", args.len());
        for (command, arg) in args {
            let section = text
                .split("\n## ")
                .find(|s| s.starts_with(&format!("wirerate-agent {command}\n")))
                .unwrap_or_else(|| panic!("no section for {command}"));
            let listed = section
                .lines()
                .filter_map(|l| l.strip_prefix("| `"))
                .any(|l| l.split('`').next().is_some_and(|name| name.contains(&arg)));
            assert!(listed, "{command} {arg} is missing from:\n{section}");
        }
    }

    #[test]
    fn defaults_environment_and_values_are_shown() {
        let text = page("t", "i", wirerate_agent::cli::command());
        assert!(
            text.contains("| `--listen <LISTEN>` | `0.0.0.0:7470` |"),
            "{text}"
        );
        assert!(text.contains("`WIRERATE_AGENT_NAME`"), "{text}");
        assert!(
            text.contains("One of `async`, `direct`, `buffered`."),
            "{text}"
        );
        let op = page("t", "i", wirerate_operator::cli::command());
        assert!(
            op.contains("`--max-writes-per-second <MAX_WRITES_PER_SECOND>`"),
            "{op}"
        );
        assert!(op.contains("`WIRERATE_ALLOWED_HOST_PATHS`"), "{op}");
    }

    #[test]
    fn flags_without_a_value_show_no_default() {
        let text = page("t", "i", wirerate_agent::cli::command());
        let json = text.lines().find(|l| l.starts_with("| `--json`")).unwrap();
        assert!(json.starts_with("| `--json` |  |  |"), "{json}");
    }
}
