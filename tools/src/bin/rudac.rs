//! `rudac`: list, emit, check and run RUDA's registered kernel configurations.

use std::process::ExitCode;

use ruda_tools::driver::{run, Command, ParseError};

fn main() -> ExitCode {
    // `args_os`: a path argument need not be UTF-8.
    let command = match Command::try_parse(std::env::args_os().skip(1)) {
        Ok(c) => c,
        // `--help` on stdout with status 0; a usage error on stderr with status 2.
        Err(ParseError::Clap(e)) => e.exit(),
        Err(ParseError::Invalid(e)) => {
            eprintln!("rudac: {e}\n\nFor more information, try '--help'.");
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
