//! Optimizers: `synkv_kv_set_optimizer` (a name plus string parameters, as MXNet's
//! `mx.optimizer.create(name, **kwargs)` takes them), `synkv_kv_set_optimizer_json` (synkv's
//! JSON description), and saving/loading the optimizer's states.
//!
//! The name-and-parameters form is translated into the JSON description and nothing more:
//! parameters that are fields of `synkv::optimizer::Common` (learning_rate, wd, rescale_grad,
//! clip_gradient, …) go under `"common"`, the others (momentum, beta1, …) beside `"name"`;
//! each value is read as JSON when it parses (`0.1`, `true`, `null`, `{"3": 2.0}`) and as a
//! string otherwise. The core parses and validates the result, so unknown names, unknown
//! parameters and out-of-range values are its errors.

use std::ffi::{c_char, c_int};

use serde_json::{Map, Value};
use synkv::optimizer::{Common, Optimizer};

use crate::error::{guard, CError, CResult};
use crate::ptr;
use crate::store::{store, SynkvKV};

/// The JSON description of optimizer `name` with `params` (see the module doc).
fn describe(name: &str, params: &[(&str, &str)]) -> CResult<String> {
    let common_fields = match serde_json::to_value(Common::default()) {
        Ok(Value::Object(m)) => m,
        _ => Map::new(),
    };
    let mut top = Map::new();
    let mut common = Map::new();
    top.insert("name".into(), Value::String(name.to_ascii_lowercase()));
    for &(key, raw) in params {
        let value = serde_json::from_str::<Value>(raw).unwrap_or_else(|_| Value::String(raw.to_string()));
        let dest = if common_fields.contains_key(key) { &mut common } else { &mut top };
        if dest.insert(key.to_string(), value).is_some() || key == "name" || key == "common" {
            return Err(CError::argument(format!("optimizer parameter `{key}` is given twice or is reserved")));
        }
    }
    top.insert("common".into(), Value::Object(common));
    serde_json::to_string(&Value::Object(top)).map_err(|e| CError::argument(e.to_string()))
}

fn install(h: &SynkvKV, optimizer: Optimizer) -> CResult {
    h.kv.set_optimizer(optimizer)?;
    // The optimizer replaced any updater: no callback runs any more.
    h.set_caller_thread(false);
    Ok(())
}

/// Installs an optimizer given by name and string parameters, e.g. `"sgd"` with
/// `{"learning_rate", "momentum"}` = `{"0.1", "0.9"}` (MXNet's `set_optimizer`). Every push
/// then runs it on the summed gradient of each key; it replaces any updater, and its states
/// start empty. Names and parameters are listed in `docs/c-api.md`.
///
/// # Safety
/// `kv` is a live store handle; `name` is a NUL-terminated string; `keys` and `vals` each hold
/// `nparams` NUL-terminated strings (both may be NULL when `nparams` is 0).
#[no_mangle]
pub unsafe extern "C" fn synkv_kv_set_optimizer(
    kv: *mut SynkvKV,
    name: *const c_char,
    nparams: u32,
    keys: *const *const c_char,
    vals: *const *const c_char,
) -> c_int {
    guard(|| {
        // SAFETY: live handle, strings and arrays as in this function's contract.
        let (h, name, keys, vals) = unsafe {
            (store(kv)?, ptr::str(name, "name")?, ptr::slice(keys, nparams as usize, "keys")?, ptr::slice(vals, nparams as usize, "vals")?)
        };
        let mut params = Vec::with_capacity(keys.len());
        for (i, (&k, &v)) in keys.iter().zip(vals).enumerate() {
            // SAFETY: each entry is a NUL-terminated string by contract.
            params.push(unsafe { (ptr::str(k, &format!("keys[{i}]"))?, ptr::str(v, &format!("vals[{i}]"))?) });
        }
        let json = describe(name, &params)?;
        install(h, Optimizer::from_json(&json).map_err(synkv::Error::from)?)
    })
}

/// Installs an optimizer from its JSON description, e.g.
/// `{"name": "sgd", "momentum": 0.9, "common": {"learning_rate": 0.1}}`.
///
/// # Safety
/// `kv` is a live store handle; `json` is a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn synkv_kv_set_optimizer_json(kv: *mut SynkvKV, json: *const c_char) -> c_int {
    guard(|| {
        // SAFETY: a live handle and a NUL-terminated string by contract.
        let (h, json) = unsafe { (store(kv)?, ptr::str(json, "json")?) };
        install(h, Optimizer::from_json(json).map_err(synkv::Error::from)?)
    })
}

/// Saves the optimizer's states (and its description) to the file `path`, once every
/// scheduled update has run (MXNet's `save_optimizer_states`; the description is always
/// included). Fails when no optimizer is installed.
///
/// # Safety
/// `kv` is a live store handle; `path` is a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn synkv_kv_save_optimizer_states(kv: *mut SynkvKV, path: *const c_char) -> c_int {
    guard(|| {
        // SAFETY: a live handle and a NUL-terminated string by contract.
        let (h, path) = unsafe { (store(kv)?, ptr::str(path, "path")?) };
        Ok(h.kv.save_optimizer_states(path)?)
    })
}

/// Loads optimizer states saved by `synkv_kv_save_optimizer_states` into the installed
/// optimizer (MXNet's `load_optimizer_states`); a file of another optimizer, or a corrupted
/// one, is an error and changes nothing.
///
/// # Safety
/// `kv` is a live store handle; `path` is a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn synkv_kv_load_optimizer_states(kv: *mut SynkvKV, path: *const c_char) -> c_int {
    guard(|| {
        // SAFETY: a live handle and a NUL-terminated string by contract.
        let (h, path) = unsafe { (store(kv)?, ptr::str(path, "path")?) };
        Ok(h.kv.load_optimizer_states(path)?)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_are_placed_by_the_cores_schema() {
        let json = describe("SGD", &[("learning_rate", "0.1"), ("momentum", "0.9"), ("lr_mult", r#"{"3": 2}"#)]).unwrap();
        let opt = Optimizer::from_json(&json).unwrap();
        assert_eq!(opt.name(), "sgd");
        assert_eq!(opt.common().learning_rate, Some(0.1));
        assert_eq!(opt.common().lr_mult.get("3"), Some(&2.0));
        assert!(describe("sgd", &[("wd", "0"), ("wd", "1")]).is_err());
        let bad = describe("sgd", &[("momentun", "0.9")]).unwrap();
        assert!(Optimizer::from_json(&bad).is_err(), "unknown parameters are the core's error");
    }
}
