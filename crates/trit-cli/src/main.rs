fn main() {
    println!("trit");
}
