//! The `berth` binary: the command line (`cli`: the server, a client for people, the load generator) over the server
//! library.

mod cli;

/// mimalloc instead of glibc's malloc: the request path allocates small, short-lived buffers on every core, and
/// glibc's arenas showed in the unbatched cycle's profile (docs/benchmark-history.md, "Design measurements").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    std::process::exit(cli::main());
}
