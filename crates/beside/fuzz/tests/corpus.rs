//! Every fuzz target's seeds, committed and built in, are read as valid by
//! the parser they are for (a seed the parser refuses would start fuzzing
//! from noise), and the committed corpus replays without a panic.

use pagewise_fuzz::mutate::Rng;
use pagewise_fuzz::targets::corpus_dir;

#[test]
fn every_seed_is_read_as_valid_by_its_parser() {
    let work = std::env::temp_dir().join(format!("pagewise-fuzz-test-{}", std::process::id()));
    let mut rng = Rng(0x5eed);
    for name in pagewise_fuzz::NAMES {
        let target = pagewise_fuzz::open(name, &work.join(name)).expect("the target sets up");
        let mut committed = 0;
        for e in std::fs::read_dir(corpus_dir(name)).expect("a committed corpus") {
            let path = e.expect("a corpus entry").path();
            let input = std::fs::read(&path).expect("a seed");
            assert!(target.feed(&input), "{name}: {} is refused", path.display());
            committed += 1;
        }
        assert!(committed > 0, "{name}: no committed seed");
        let built = target.seeds(&mut rng);
        assert!(!built.is_empty(), "{name}: no built-in seed");
        for (i, input) in built.iter().enumerate() {
            assert!(target.feed(input), "{name}: built-in seed {i} is refused");
        }
        // The empty input is refused by every parser.
        assert!(
            !target.feed(&[]),
            "{name}: the empty input is read as valid"
        );
        println!(
            "{name}: {committed} committed and {} built-in seeds read",
            built.len()
        );
    }
    let _ = std::fs::remove_dir_all(&work);
}
