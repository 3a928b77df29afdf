//! Where the library's notices go: the library's rooms never print; they say what happened
//! through `log`, and the binary writes each notice as one line on stderr (`warning: …` for
//! warnings, `sovereign: …` for the rest).

struct Stderr;

impl log::Log for Stderr {
    fn enabled(&self, m: &log::Metadata) -> bool {
        m.level() <= log::Level::Info && m.target().starts_with("sovereign")
    }

    fn log(&self, r: &log::Record) {
        if self.enabled(r.metadata()) {
            let prefix = if r.level() <= log::Level::Warn { "warning" } else { "sovereign" };
            eprintln!("{prefix}: {}", r.args());
        }
    }

    fn flush(&self) {}
}

static STDERR: Stderr = Stderr;

/// Routes the library's notices to stderr (once, before any command runs).
pub fn install() {
    if log::set_logger(&STDERR).is_ok() {
        log::set_max_level(log::LevelFilter::Info);
    }
}
