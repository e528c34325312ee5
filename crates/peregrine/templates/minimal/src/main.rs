//! `{{package}}`: every Peregrine command for this application — `chat`, `run`, `health`,
//! `config`, `threads`, `init`, `completions` — from one call.

fn main() -> std::process::ExitCode {
    peregrine::main({{crate}}::App)
}
