//! `orchard-probe`: the only file of the real node's "no shell, no libc" test image. It proves that a
//! sandbox works with an image that has nothing but one static binary: the injected agent runs argv
//! commands in it. Subcommands (one per line of output, easy to assert on):
//!   echo ARGS...   prints the arguments joined by spaces
//!   id             prints `uid=<uid> gid=<gid> pid=<pid>`
//!   ls DIR         prints the entries of DIR, sorted
//!   alloc MIB      allocates and touches MIB mebibytes, then prints `allocated MIB`

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let code = match args.first().map(String::as_str) {
        Some("echo") => {
            println!("{}", args[1..].join(" "));
            0
        }
        Some("id") => {
            // SAFETY: getuid and getgid cannot fail.
            let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
            println!("uid={uid} gid={gid} pid={}", std::process::id());
            0
        }
        Some("ls") => match std::fs::read_dir(args.get(1).map_or("/", String::as_str)) {
            Ok(entries) => {
                let mut names: Vec<String> = entries
                    .flatten()
                    .map(|e| e.file_name().to_string_lossy().to_string())
                    .collect();
                names.sort();
                for name in names {
                    println!("{name}");
                }
                0
            }
            Err(err) => {
                eprintln!("ls: {err}");
                1
            }
        },
        Some("alloc") => match args.get(1).and_then(|m| m.parse::<usize>().ok()) {
            Some(mib) => {
                let mut block = vec![0u8; mib << 20];
                for page in block.chunks_mut(4096) {
                    page[0] = 1;
                }
                println!("allocated {}", block.len() >> 20);
                0
            }
            None => {
                eprintln!("alloc: give a size in MiB");
                2
            }
        },
        _ => {
            eprintln!("usage: orchard-probe echo ARGS... | id | ls DIR | alloc MIB");
            2
        }
    };
    std::process::exit(code);
}
