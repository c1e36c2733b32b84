// The migrations are embedded by `sqlx::migrate!`; a new or changed file
// must rebuild the crate (sqlx's recommended build script).
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
