//! Writes the shipped text the train example's text mode is shown on: Cicero's De finibus
//! bonorum et malorum, book I (public domain), as the `lipsum` crate ships it, a `.txt` file
//! of 79 blank-line-separated paragraphs (one document each for `--dataset-type hf`).
//!
//! ```sh
//! cargo run --example liber_primus -- liber_primus.txt
//! ```

fn main() {
    let Some(path) = std::env::args_os().nth(1) else {
        eprintln!("error: name the file to write, e.g. `cargo run --example liber_primus -- liber_primus.txt`");
        std::process::exit(2);
    };
    if let Err(e) = std::fs::write(&path, lipsum::LIBER_PRIMUS) {
        eprintln!(
            "error: cannot write {}: {e}",
            std::path::Path::new(&path).display()
        );
        std::process::exit(1);
    }
    println!(
        "wrote Cicero's De finibus, book I ({} bytes) to {}",
        lipsum::LIBER_PRIMUS.len(),
        std::path::Path::new(&path).display()
    );
}
