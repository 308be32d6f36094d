//! The `berth` binary: parses the command line and hands over to `berth::cli`.

fn main() {
    std::process::exit(berth::cli::main());
}
