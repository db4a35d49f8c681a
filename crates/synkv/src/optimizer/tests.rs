//! Tests of state files, validation, error paths and properties (proptest).
//!
//! MXNet-oracle comparisons are in `oracle_tests.rs`.

use half::{bf16, f16};
use proptest::prelude::*;

use super::*;

#[test]
fn states_round_trip_through_a_file() {
    let mut u = Updater::new(Optimizer::adam().with_multi_precision(true));
    let mut w16 = vec![f16::from_f32(0.5); 5];
    let g16 = vec![f16::from_f32(0.1); 5];
    u.update("a", WeightMut::F16(&mut w16), GradRef::F16(&g16)).unwrap();
    let mut w64 = vec![1.0f64; 3];
    u.update("b", WeightMut::F64(&mut w64), GradRef::F64(&[0.2, -0.1, 0.0])).unwrap();
    let dir = std::env::temp_dir().join(format!("synkv-opt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("states.bin");
    u.save_states_to(&path).unwrap();
    let mut v = Updater::new(Optimizer::adam().with_multi_precision(true));
    v.load_states_from(&path).unwrap();
    assert_eq!(v.state("a"), u.state("a"));
    assert_eq!(v.state("b"), u.state("b"));
    assert_eq!(v.update_count("b"), Some(1));
    std::fs::remove_dir_all(&dir).unwrap();
    let err = v.load_states_from(dir.join("missing")).unwrap_err();
    assert!(matches!(err, Error::Io { action: "read", .. }), "{err}");
}

fn sample_states() -> Vec<u8> {
    let mut u = Updater::new(Optimizer::adam());
    let mut w = vec![1.0f32, 2.0, 3.0];
    u.update("k", WeightMut::F32(&mut w), GradRef::F32(&[0.1, 0.2, 0.3])).unwrap();
    u.save_states()
}

fn corrupt_reason(bytes: &[u8]) -> String {
    let err = Updater::new(Optimizer::adam()).load_states(bytes).unwrap_err();
    assert!(matches!(err, Error::CorruptStateFile { .. }), "{err}");
    let msg = err.to_string();
    assert!(msg.starts_with("corrupted or not a synkv optimizer-state file"), "{msg}");
    msg
}

#[test]
fn corrupted_files_are_rejected() {
    let good = sample_states();
    assert!(corrupt_reason(&good[..10]).contains("truncated"));
    assert!(corrupt_reason(&good[..good.len() - 1]).contains("checksum"));
    let mut bad = good.clone();
    bad[0] = b'X';
    assert!(corrupt_reason(&bad).contains("magic"));
    let mut bad = good.clone();
    bad[8] = 2;
    assert!(corrupt_reason(&bad).contains("version 2"));
    let mut bad = good.clone();
    let mid = bad.len() / 2;
    bad[mid] ^= 0x40;
    assert!(corrupt_reason(&bad).contains("checksum"));
    assert!(corrupt_reason(b"definitely not a state file at all").contains("magic"));
}

#[test]
fn forged_headers_are_rejected() {
    // A well-formed frame (valid checksum) around a lying header.
    fn frame(header: &str, blob: &[u8]) -> Vec<u8> {
        let mut out = b"SYNKVOPT".to_vec();
        out.extend_from_slice(&1u32.to_le_bytes());
        out.extend_from_slice(&(header.len() as u64).to_le_bytes());
        out.extend_from_slice(header.as_bytes());
        out.extend_from_slice(blob);
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }
    let opt = Optimizer::adam().to_json();
    let slot = |name: &str, len: u64, offset: u64| format!(r#"{{"name":"{name}","dtype":"f32","len":{len},"offset":{offset}}}"#);
    let key = |slots: String| {
        format!(
            r#"{{"optimizer":{opt},"num_update":1,"counts":{{"k":1}},"states":[{{"key":"k","dtype":"f32","len":2,"slots":[{slots}]}}]}}"#
        )
    };
    let ok = key(format!("{},{}", slot("mean", 2, 0), slot("var", 2, 8)));
    let mut u = Updater::new(Optimizer::adam());
    u.load_states(&frame(&ok, &[0u8; 16])).unwrap();
    assert!(corrupt_reason(&frame(&ok, &[0u8; 15])).contains("past the end"));
    assert!(corrupt_reason(&frame(&ok, &[0u8; 17])).contains("after the last slot"));
    let gap = key(format!("{},{}", slot("mean", 2, 0), slot("var", 2, 12)));
    assert!(corrupt_reason(&frame(&gap, &[0u8; 20])).contains("starts at byte"));
    let odd = key(format!("{},{}", slot("mean", 2, 0), slot("bogus", 2, 8)));
    assert!(corrupt_reason(&frame(&odd, &[0u8; 16])).contains("unknown slot"));
    let short = key(format!("{},{}", slot("mean", 1, 0), slot("var", 2, 4)));
    assert!(corrupt_reason(&frame(&short, &[0u8; 12])).contains("slot mean"));
    assert!(corrupt_reason(&frame("{not json", &[])).contains("invalid header"));
    let mut huge = frame(&ok, &[0u8; 16]);
    huge[12..20].copy_from_slice(&u64::MAX.to_le_bytes());
    let n = huge.len() - 4;
    let crc = crc32fast::hash(&huge[..n]);
    huge[n..].copy_from_slice(&crc.to_le_bytes());
    assert!(corrupt_reason(&huge).contains("header length"));
}

#[test]
fn states_from_another_optimizer_are_rejected() {
    let err = Updater::new(Optimizer::sgd()).load_states(&sample_states()).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::OptimizerMismatch { .. }));
    assert!(msg.contains("`adam`") && msg.contains("`sgd`"), "{msg}");
}

#[test]
fn states_that_do_not_fit_are_rejected() {
    // Same optimizer, other settings: momentum slot present vs absent.
    let mut u = Updater::new(Optimizer::from(Sgd { momentum: 0.9, ..Sgd::default() }));
    let mut w = vec![1.0f32; 4];
    u.update("7", WeightMut::F32(&mut w), GradRef::F32(&[1.0; 4])).unwrap();
    let err = Updater::new(Optimizer::sgd()).load_states(&u.save_states()).unwrap_err();
    assert!(matches!(err, Error::StateMismatch { ref key, .. } if key == "7"), "{err}");

    // Element count differs: reported when the key is next used, naming the key.
    let mut v = Updater::new(Optimizer::from(Sgd { momentum: 0.9, ..Sgd::default() }));
    v.load_states(&u.save_states()).unwrap();
    let mut w6 = vec![1.0f32; 6];
    let err = v.update("7", WeightMut::F32(&mut w6), GradRef::F32(&[1.0; 6])).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("key 7") && msg.contains("4 elements") && msg.contains("6"), "{msg}");
    assert_eq!(v.update_count("7"), Some(1), "a failed update does not count");

    // dtype of the weight changed (f32 states, f64 weight).
    let mut w64 = vec![1.0f64; 4];
    let err = v.update("7", WeightMut::F64(&mut w64), GradRef::F64(&[1.0; 4])).unwrap_err();
    assert!(err.to_string().contains("f64"), "{err}");

    // A master copy without multi-precision.
    let mut m = Updater::new(Optimizer::adam().with_multi_precision(true));
    let mut wh = vec![bf16::from_f32(1.0); 2];
    m.update("h", WeightMut::BF16(&mut wh), GradRef::BF16(&[bf16::from_f32(0.5); 2])).unwrap();
    let err = Updater::new(Optimizer::adam()).load_states(&m.save_states()).unwrap_err();
    assert!(err.to_string().contains("master copy"), "{err}");
}

#[test]
fn mismatched_weight_and_gradient_are_errors() {
    let mut u = Updater::new(Optimizer::sgd());
    let mut w = vec![0.0f32; 3];
    let err = u.update("x", WeightMut::F32(&mut w), GradRef::F64(&[0.0; 3])).unwrap_err();
    assert!(matches!(err, Error::DTypeMismatch { .. }), "{err}");
    assert!(err.to_string().contains("key x: gradient is f64 but the weight is f32"));
    let err = u.update("x", WeightMut::F32(&mut w), GradRef::F32(&[0.0; 2])).unwrap_err();
    assert!(matches!(err, Error::LengthMismatch { weight: 3, grad: 2, .. }), "{err}");
    assert_eq!(u.update_count("x"), None);
}

#[test]
fn invalid_row_sparse_gradients_are_errors() {
    let mut u = Updater::new(Optimizer::sgd());
    let mut w = vec![0.0f32; 6];
    let mut check = |row_len: usize, rows: &[i64], data: &[f32], needle: &str| {
        let err = u.update_row_sparse("s", WeightMut::F32(&mut w), row_len, rows, GradRef::F32(data)).unwrap_err();
        assert!(matches!(err, Error::InvalidSparseGradient { .. }), "{err}");
        assert!(err.to_string().contains(needle), "{err} lacks {needle:?}");
    };
    check(0, &[], &[], "row_len is 0");
    check(4, &[0], &[0.0; 4], "not a multiple");
    check(2, &[0, 1], &[0.0; 2], "need 4 data elements");
    check(2, &[3], &[0.0; 2], "row id 3 is outside");
    check(2, &[-1], &[0.0; 2], "row id -1 is outside");
    check(2, &[1, 1], &[0.0; 4], "sorted ascending and distinct");
    check(2, &[2, 0], &[0.0; 4], "sorted ascending and distinct");
}

#[test]
fn json_round_trips_and_validates() {
    let all = [
        Optimizer::sgd(),
        Optimizer::nag(),
        Optimizer::signum(),
        Optimizer::adam(),
        Optimizer::adamw(),
        Optimizer::lamb(),
        Optimizer::adagrad(),
        Optimizer::rmsprop(),
        Optimizer::adadelta(),
        Optimizer::ftrl(),
        Optimizer::test(),
    ];
    for opt in all {
        let opt = opt
            .with_wd(0.01)
            .with_clip_gradient(1.0)
            .with_lr_mult("w", 0.5)
            .with_lr_scheduler(LrScheduler::cosine(100, 0.0).with_warmup(5, 0.0, WarmupMode::Linear));
        let json = opt.to_json();
        assert!(json.contains(&format!("\"name\":\"{}\"", opt.name())), "{json}");
        assert_eq!(Optimizer::from_json(&json).unwrap(), opt);
    }
    assert_eq!(Optimizer::from_json(r#"{"name":"sgd"}"#).unwrap(), Optimizer::sgd());
    assert_eq!(Optimizer::adam().learning_rate(), 0.001);
    assert_eq!(Optimizer::ftrl().learning_rate(), 0.1);

    let rejects = |json: &str, needle: &str| {
        let err = Optimizer::from_json(json).unwrap_err();
        assert!(err.to_string().contains(needle), "{json}: {err}");
    };
    rejects(r#"{"name":"sgd","momentun":0.9}"#, "unknown field `momentun`");
    rejects(r#"{"name":"sgdd"}"#, "unknown variant `sgdd`");
    rejects(r#"{"momentum":0.9}"#, "missing field `name`");
    rejects(r#"{"name":"sgd","common":{"learning_rate":-0.1}}"#, "learning_rate");
    rejects(r#"{"name":"sgd","common":{"wd":-1}}"#, "`wd`");
    rejects(r#"{"name":"sgd","common":{"clip_gradient":0}}"#, "use null (None) to disable");
    rejects(r#"{"name":"sgd","momentum":1.0}"#, "[0, 1)");
    rejects(r#"{"name":"adam","epsilon":0}"#, "epsilon");
    rejects(r#"{"name":"lamb","lower_bound":-1}"#, "lower_bound");
    rejects(
        r#"{"name":"sgd","common":{"learning_rate":0.1,"lr_scheduler":{"schedule":{"type":"factor","step":2,"factor":0.5},"warmup":{"steps":2,"begin_lr":0.5}}}}"#,
        "must not exceed the base learning rate",
    );
    rejects(r#"{"name":"sgd","common":{"lr_mult":{"a":-2}}}"#, "lr_mult[\"a\"]");
}

#[test]
fn invalid_optimizer_is_reported_by_update() {
    let bad = Optimizer::sgd().with_learning_rate(f64::NAN);
    assert!(Updater::try_new(bad.clone()).is_err());
    let mut u = Updater::new(bad);
    let mut w = vec![0.0f32; 1];
    let err = u.update("0", WeightMut::F32(&mut w), GradRef::F32(&[1.0])).unwrap_err();
    assert!(matches!(err, Error::InvalidParameter { .. }), "{err}");
}

#[test]
fn counts_start_at_begin_num_update_and_num_update_is_the_max() {
    let mut u = Updater::new(Optimizer::sgd().with_begin_num_update(10));
    let mut a = vec![0.0f32; 2];
    let mut b = vec![0.0f32; 2];
    let g = [1.0f32; 2];
    assert_eq!(u.num_update(), 10);
    u.update("a", WeightMut::F32(&mut a), GradRef::F32(&g)).unwrap();
    u.update("a", WeightMut::F32(&mut a), GradRef::F32(&g)).unwrap();
    u.update("b", WeightMut::F32(&mut b), GradRef::F32(&g)).unwrap();
    assert_eq!(u.update_count("a"), Some(12));
    assert_eq!(u.update_count("b"), Some(11));
    assert_eq!(u.num_update(), 12);
}

#[test]
fn test_optimizer_adds_rescaled_gradient() {
    let mut u = Updater::new(Optimizer::test().with_rescale_grad(2.0).with_learning_rate(5.0));
    let mut w = vec![1.0f32, 2.0];
    u.update("0", WeightMut::F32(&mut w), GradRef::F32(&[1.0, -1.0])).unwrap();
    assert_eq!(w, [3.0, 0.0]);
    assert_eq!(u.state("0").unwrap().slot_names().count(), 0);
}

fn sgd_momentum(lazy: bool) -> Optimizer {
    Optimizer::from(Sgd { momentum: 0.9, lazy_update: lazy, ..Sgd::default() })
        .with_learning_rate(0.1)
        .with_wd(0.01)
        .with_clip_gradient(0.5)
}

/// A row_sparse gradient: sorted distinct rows (from a mask) and their data.
fn sparse_grad(nrows: usize, row_len: usize) -> impl Strategy<Value = (Vec<i64>, Vec<f32>)> {
    proptest::collection::vec(any::<bool>(), nrows).prop_flat_map(move |mask| {
        let rows: Vec<i64> = (0..nrows as i64).filter(|&r| mask[r as usize]).collect();
        let n = rows.len() * row_len;
        (Just(rows), proptest::collection::vec(-2.0f32..2.0, n))
    })
}

fn densified(nrows: usize, row_len: usize, rows: &[i64], data: &[f32]) -> Vec<f32> {
    let mut g = vec![0.0f32; nrows * row_len];
    for (i, &r) in rows.iter().enumerate() {
        let r = r as usize;
        g[r * row_len..(r + 1) * row_len].copy_from_slice(&data[i * row_len..(i + 1) * row_len]);
    }
    g
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Standard (non-lazy) sparse updates equal the dense update on the densified gradient.
    #[test]
    fn standard_sparse_equals_dense_on_densified(
        (nrows, row_len, w0, steps) in (1usize..6, 1usize..5).prop_flat_map(|(nrows, row_len)| (
            Just(nrows),
            Just(row_len),
            proptest::collection::vec(-1.0f32..1.0, nrows * row_len),
            proptest::collection::vec(sparse_grad(nrows, row_len), 1..4),
        ))
    ) {
        for opt in [sgd_momentum(false), Optimizer::from(AdaGrad { lazy_update: false, ..AdaGrad::default() }).with_wd(0.1),
                    Optimizer::from(Ftrl { lazy_update: false, ..Ftrl::default() })] {
            let mut sparse = Updater::new(opt.clone());
            let mut dense = Updater::new(opt);
            let (mut ws, mut wd) = (w0.clone(), w0.clone());
            for (rows, data) in &steps {
                sparse.update_row_sparse("k", WeightMut::F32(&mut ws), row_len, rows, GradRef::F32(data)).unwrap();
                let g = densified(nrows, row_len, rows, data);
                dense.update("k", WeightMut::F32(&mut wd), GradRef::F32(&g)).unwrap();
            }
            prop_assert_eq!(&ws, &wd);
        }
    }

    /// Lazy updates leave absent rows (weight and state) untouched and move present rows
    /// exactly as a dense update restricted to them.
    #[test]
    fn lazy_sparse_touches_only_present_rows(
        (nrows, row_len, w0, (rows, data)) in (2usize..6, 1usize..4).prop_flat_map(|(nrows, row_len)| (
            Just(nrows),
            Just(row_len),
            proptest::collection::vec(-1.0f32..1.0, nrows * row_len),
            sparse_grad(nrows, row_len),
        ))
    ) {
        let mut u = Updater::new(sgd_momentum(true));
        let mut w = w0.clone();
        u.update_row_sparse("k", WeightMut::F32(&mut w), row_len, &rows, GradRef::F32(&data)).unwrap();
        let mom = u.state("k").unwrap().slot_f32("momentum").unwrap().to_vec();
        for r in 0..nrows {
            let span = r * row_len..(r + 1) * row_len;
            match rows.iter().position(|&x| x as usize == r) {
                None => {
                    prop_assert_eq!(&w[span.clone()], &w0[span.clone()]);
                    prop_assert!(mom[span].iter().all(|&m| m == 0.0));
                }
                Some(i) => {
                    let mut row = Updater::new(sgd_momentum(true));
                    let mut wr = w0[span.clone()].to_vec();
                    let g = &data[i * row_len..(i + 1) * row_len];
                    row.update("r", WeightMut::F32(&mut wr), GradRef::F32(g)).unwrap();
                    prop_assert_eq!(&w[span], &wr[..]);
                }
            }
        }
    }

    /// Saving and loading reproduces the states and the exact bytes.
    #[test]
    fn state_files_round_trip(
        grads in proptest::collection::vec(proptest::collection::vec(-3.0f32..3.0, 5), 1..4),
        keys in proptest::collection::vec("[a-z0-9_]{1,6}", 1..4),
    ) {
        for opt in [Optimizer::adam(), Optimizer::rmsprop(), sgd_momentum(true)] {
            let mut u = Updater::new(opt.clone().with_multi_precision(true));
            for (i, g) in grads.iter().enumerate() {
                let key = &keys[i % keys.len()];
                if i % 2 == 0 {
                    let mut w = vec![0.25f32; 5];
                    u.update(key, WeightMut::F32(&mut w), GradRef::F32(g)).ok();
                } else {
                    let mut w = vec![f16::from_f32(0.25); 5];
                    let g16: Vec<f16> = g.iter().map(|&x| f16::from_f32(x)).collect();
                    u.update(key, WeightMut::F16(&mut w), GradRef::F16(&g16)).ok();
                }
            }
            let bytes = u.save_states();
            let v = Updater::from_saved_states(&bytes).unwrap();
            prop_assert_eq!(v.save_states(), bytes);
            for key in &keys {
                prop_assert_eq!(v.state(key), u.state(key));
                prop_assert_eq!(v.update_count(key), u.update_count(key));
            }
        }
    }

    /// Any single-byte corruption is detected.
    #[test]
    fn any_flipped_byte_is_detected(pos in any::<prop::sample::Index>(), bit in 0u8..8) {
        let mut u = Updater::new(Optimizer::adam());
        let mut w = vec![1.0f32; 3];
        u.update("k", WeightMut::F32(&mut w), GradRef::F32(&[0.5, -0.5, 0.1])).unwrap();
        let mut bytes = u.save_states();
        let i = pos.index(bytes.len());
        bytes[i] ^= 1 << bit;
        let err = Updater::new(Optimizer::adam()).load_states(&bytes).unwrap_err();
        prop_assert!(matches!(err, Error::CorruptStateFile { .. }), "{}", err);
    }
}

#[test]
fn public_types_are_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Updater>();
    check::<Optimizer>();
    check::<OptimizerState>();
    check::<Error>();
    check::<WeightMut<'static>>();
    check::<GradRef<'static>>();
}

/// Row-sparse updates large enough to run on the rayon pool (lazy: across rows; standard:
/// within the zero-gradient segments) agree with the dense reference.
#[test]
fn large_sparse_updates_match_dense() {
    let (nrows, row_len) = (700, 256);
    let rows: Vec<i64> = (0..nrows as i64).filter(|r| r % 3 != 1).collect();
    let data: Vec<f32> = (0..rows.len() * row_len).map(|i| ((i % 13) as f32 - 6.0) * 0.1).collect();
    let w0: Vec<f32> = (0..nrows * row_len).map(|i| ((i % 7) as f32 - 3.0) * 0.2).collect();
    let dense_grad = densified(nrows, row_len, &rows, &data);

    let mut std_sparse = Updater::new(sgd_momentum(false));
    let mut dense = Updater::new(sgd_momentum(false));
    let (mut a, mut b) = (w0.clone(), w0.clone());
    for _ in 0..2 {
        std_sparse.update_row_sparse("k", WeightMut::F32(&mut a), row_len, &rows, GradRef::F32(&data)).unwrap();
        dense.update("k", WeightMut::F32(&mut b), GradRef::F32(&dense_grad)).unwrap();
    }
    assert_eq!(a, b);

    let mut lazy = Updater::new(sgd_momentum(true));
    let mut c = w0.clone();
    lazy.update_row_sparse("k", WeightMut::F32(&mut c), row_len, &rows, GradRef::F32(&data)).unwrap();
    let mut one = Updater::new(sgd_momentum(true));
    let mut d = w0.clone();
    one.update("k", WeightMut::F32(&mut d), GradRef::F32(&dense_grad)).unwrap();
    for r in 0..nrows {
        let span = r * row_len..(r + 1) * row_len;
        if r % 3 == 1 {
            assert_eq!(c[span.clone()], w0[span], "row {r} is absent and untouched");
        } else {
            assert_eq!(c[span.clone()], d[span], "row {r} as in the dense update");
        }
    }
}
