//! The `berth` binary: the command line (`cli`: the server, a client for people, the load generator) over the server
//! library.

mod cli;

fn main() {
    std::process::exit(cli::main());
}
