//! `rudac`: list, emit, check and run RUDA's registered kernel configurations.

use std::process::ExitCode;

use ruda_tools::driver::{run, Command};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let command = match Command::parse(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("rudac: {e}\n\n{}", ruda_tools::driver::USAGE);
            return ExitCode::from(2);
        }
    };
    let mut stdout = std::io::stdout().lock();
    match run(&command, &mut stdout) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("rudac: {e}");
            ExitCode::FAILURE
        }
    }
}
