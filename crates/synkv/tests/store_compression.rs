//! Gradient compression through the store (spec K7.1, K7.2, K7.9, K7.14, K11 T23): a `device`
//! store quantizes every pushed value with a residual per (key, source), dequantizes and sums;
//! a `local` store refuses compression, as MXNet does.

mod common;

use common::bounded;
use synkv::optimizer::{Optimizer, TestOptimizer};
use synkv::store::Error as StoreError;
use synkv::{create, Context, DType, Error, KVStore, NDArray};

const SHAPE: [usize; 2] = [2, 3];
const DEVICES: usize = 4;
const RATE: f64 = 2.0;

/// A `local_allreduce_device` store with compression and the test optimizer `w += RATE·g`
/// (T23's setup), key 9 initialised with zeros.
fn t23_store(params: &[(&str, &str)]) -> KVStore {
    let kv = create("local_allreduce_device").unwrap();
    kv.set_gradient_compression(params.iter().copied()).unwrap();
    kv.set_optimizer(Optimizer::from(TestOptimizer::default()).with_rescale_grad(RATE)).unwrap();
    kv.init(9, &NDArray::zeros(SHAPE)).unwrap();
    kv
}

fn push_all(kv: &KVStore, value: f64) {
    let vals: Vec<NDArray> = (0..DEVICES).map(|d| NDArray::full_with(SHAPE, value, DType::F32, Context::cpu(d))).collect();
    kv.push(9, &vals).unwrap();
}

fn pulled(kv: &KVStore, key: i32) -> Vec<f32> {
    let out = NDArray::zeros(SHAPE);
    kv.pull(key, &out).unwrap();
    out.to_vec::<f32>().unwrap()
}

#[test]
fn two_bit_residual_sequence_t23() {
    bounded(|| {
        let kv = t23_store(&[("type", "2bit"), ("threshold", "0.5")]);
        // init is not compressed: a key initialised with ones pulls ones
        kv.init(10, &NDArray::ones(SHAPE)).unwrap();
        assert_eq!(pulled(&kv, 10), vec![1.0; 6]);
        // zeros quantize to zeros
        push_all(&kv, 0.0);
        assert_eq!(pulled(&kv, 9), vec![0.0; 6]);
        // 0.4 stays in the residual; 0.2 crosses t (+t·rate·n = 4); 0.2 stays; 0.2 crosses again
        let expected = [0.0, 4.0, 4.0, 8.0];
        for (value, want) in [0.4, 0.2, 0.2, 0.2].into_iter().zip(expected) {
            push_all(&kv, value);
            assert_eq!(pulled(&kv, 9), vec![want as f32; 6], "after pushing {value}");
        }
        // −t from every device: −t·rate·n
        push_all(&kv, -0.5);
        assert_eq!(pulled(&kv, 9), vec![4.0; 6]);
    });
}

#[test]
fn one_bit_pushes_t23() {
    bounded(|| {
        for threshold in ["-0.5", "0", "0.5"] {
            let kv = t23_store(&[("type", "1bit"), ("threshold", threshold)]);
            let per_push = (RATE * DEVICES as f64) as f32;
            for i in 0..10 {
                push_all(&kv, 1.0);
                assert_eq!(pulled(&kv, 9), vec![(i + 1) as f32 * per_push; 6], "threshold {threshold}, push {i}");
            }
            for i in 0..10 {
                push_all(&kv, -1.0);
                assert_eq!(pulled(&kv, 9), vec![(9 - i) as f32 * per_push; 6], "threshold {threshold}, push −{i}");
            }
        }
    });
}

#[test]
fn a_single_device_push_is_quantized_too() {
    bounded(|| {
        // K7.9 / K12.2: even one device's value goes through quantize → dequantize (assign)
        let kv = create("device").unwrap();
        kv.set_gradient_compression([("type", "2bit"), ("threshold", "0.5")]).unwrap();
        kv.init(1, &NDArray::zeros([8])).unwrap();
        let g = NDArray::from_vec([8], vec![0.6f32, -0.7, 0.2, 0.5, -0.5, 0.0, 1.2, -0.49]).unwrap();
        kv.push(1, &g).unwrap();
        let out = NDArray::zeros([8]);
        kv.pull(1, &out).unwrap();
        // K7.6's dequantized vector
        assert_eq!(out.to_vec::<f32>().unwrap(), vec![0.5, -0.5, 0.0, 0.5, -0.5, 0.0, 0.5, 0.0]);
        // the residual carries over: pushing zeros now sends what was held back
        // (residual [0.1,−0.2,0.2,0,0,0,0.7,−0.49] → only 0.7 reaches t)
        kv.push(1, &NDArray::zeros([8])).unwrap();
        kv.pull(1, &out).unwrap();
        assert_eq!(out.to_vec::<f32>().unwrap(), vec![0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.5, 0.0]);
    });
}

#[test]
fn local_stores_refuse_compression_and_parameters_are_validated() {
    bounded(|| {
        for ty in ["local", "local_allreduce_cpu", "local_update_cpu"] {
            let kv = create(ty).unwrap();
            let err = kv.set_gradient_compression([("type", "2bit")]).unwrap_err();
            assert!(matches!(&err, Error::Store(StoreError::Unsupported { .. })), "{ty}: {err:?}");
            assert!(err.to_string().contains("not supported for this type of kvstore"), "{err}");
        }
        let kv = create("device").unwrap();
        let missing = kv.set_gradient_compression([("threshold", "0.5")]).unwrap_err().to_string();
        assert!(missing.contains("type"), "{missing}");
        let unknown = kv.set_gradient_compression([("type", "3bit")]).unwrap_err().to_string();
        assert!(unknown.contains("3bit"), "{unknown}");
        let zero = kv.set_gradient_compression([("type", "2bit"), ("threshold", "0")]).unwrap_err().to_string();
        assert!(zero.contains("greater than 0"), "{zero}");
        // 1bit accepts any threshold, and unknown keys are ignored (K7.2)
        kv.set_gradient_compression([("type", "1bit"), ("threshold", "-1"), ("other", "x")]).unwrap();
    });
}

#[test]
fn compression_needs_dense_f32_values_and_the_store_keeps_working() {
    bounded(|| {
        let kv = create("device").unwrap();
        kv.init(1, &NDArray::zeros_with([4], DType::F64, Context::cpu(0))).unwrap();
        kv.init(2, &NDArray::zeros([4])).unwrap();
        // compression switched on after init is fine on a device store (K7.9)
        kv.set_gradient_compression([("type", "2bit"), ("threshold", "0.5")]).unwrap();
        let err = kv.push(1, &NDArray::ones_on([4], Context::cpu(0)).as_type(DType::F64).unwrap()).unwrap_err();
        assert!(err.to_string().contains("float32"), "{err}");
        kv.push(2, &NDArray::ones([4])).unwrap();
        let out = NDArray::zeros([4]);
        kv.pull(2, &out).unwrap();
        assert_eq!(out.to_vec::<f32>().unwrap(), vec![0.5; 4]);
    });
}
