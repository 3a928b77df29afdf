//! A campaign runner's progress as the user sees it: a bar on a terminal, with each settled
//! cell's line above it; elsewhere (a pipe, a log file, `--json`, a cluster task) the lines
//! alone on stderr.

use sovereign::campaign::Progress;
use std::io::IsTerminal;
use std::sync::Arc;

/// The lines on stderr, and a bar when `bar` is asked for and stderr is a terminal.
pub fn on_stderr(bar: bool) -> Arc<dyn Progress> {
    if bar && std::io::stderr().is_terminal() {
        Arc::new(Bar(indicatif::ProgressBar::hidden()))
    } else {
        Arc::new(Lines)
    }
}

struct Lines;

impl Progress for Lines {
    fn line(&self, line: &str, _settled: bool) {
        eprintln!("{line}");
    }
}

struct Bar(indicatif::ProgressBar);

impl Progress for Bar {
    fn start(&self, total: usize, done: usize) {
        self.0.set_length(total as u64);
        self.0.set_draw_target(indicatif::ProgressDrawTarget::stderr());
        self.0.set_style(
            indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} cells  {elapsed_precise} elapsed, ETA {eta}  {msg}")
                .expect("a valid template"),
        );
        self.0.set_position(done as u64);
        self.0.reset_eta();
    }

    fn running(&self, key: &str) {
        self.0.set_message(format!("running {key}"));
    }

    fn line(&self, line: &str, settled: bool) {
        self.0.println(line);
        if settled {
            self.0.inc(1);
        }
    }

    fn finish(&self) {
        self.0.finish_and_clear();
    }
}
