//! `fleetrun-runner`: started by the node agent with its channel on fd 3; see the library.

fn main() {
    fleetrun_runner::exit(fleetrun_runner::main())
}
