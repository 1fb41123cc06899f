//! Rebuilds the store when a migration is added: `sqlx::migrate!` embeds the folder's files, but
//! cargo only notices a new file if told to watch the folder.

fn main() {
    println!("cargo:rerun-if-changed=../../migrations");
}
