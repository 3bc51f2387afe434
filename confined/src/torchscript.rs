//! A user's TorchScript module as the executor trains it: loaded through
//! libtorch's own `torch::jit::Module` (by `csrc/module.cpp`, because tch
//! reaches neither buffers nor train/eval mode nor the forward's schema),
//! its tensors under PyTorch's `state_dict()` names.
//!
//! The module keeps its own tensors; [`Module::parameters`] and
//! [`Module::buffers`] hand out handles that share them, so a replica that
//! points a parameter at a view of its flat weights (`set_data`) trains the
//! module itself, and [`Module::save`] writes the trained module back —
//! what a user loads with `torch.jit.load`.
//!
//! This is the executor's only `unsafe` code: calls into the C++ above,
//! each of which catches libtorch's exceptions and returns them as text.
#![allow(unsafe_code)]

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::Path;
use tch::{Device, TchError, Tensor};
use torch_sys::C_tensor;

type NamedCallback = extern "C" fn(*mut c_void, *const c_char, *mut C_tensor);

extern "C" {
    fn ty_free_message(m: *mut c_char);
    fn ty_load(path: *const c_char, device: c_int, out: *mut *mut c_void) -> *mut c_char;
    fn ty_free(m: *mut c_void);
    fn ty_named(m: *mut c_void, buffers: c_int, data: *mut c_void, f: NamedCallback)
        -> *mut c_char;
    fn ty_train(m: *mut c_void, on: c_int) -> *mut c_char;
    fn ty_forward_schema(
        m: *mut c_void,
        schema: *mut *mut c_char,
        names: *mut *mut c_char,
        tensor_args: *mut c_int,
        args: *mut c_int,
        returns_tensor: *mut c_int,
    ) -> *mut c_char;
    fn ty_forward(m: *mut c_void, x: *const C_tensor, out: *mut *mut C_tensor) -> *mut c_char;
    fn ty_forward_many(
        m: *mut c_void,
        xs: *const *const C_tensor,
        n: c_int,
        out: *mut *mut C_tensor,
    ) -> *mut c_char;
    fn ty_save(m: *mut c_void, path: *const c_char) -> *mut c_char;
}

/// Turns the shim's answer (NULL or a malloc'd message) into a result.
fn checked(msg: *mut c_char) -> Result<(), TchError> {
    if msg.is_null() {
        return Ok(());
    }
    // SAFETY: a non-null answer is a NUL-terminated string the shim
    // allocated with malloc, freed here exactly once.
    let text = unsafe {
        let s = CStr::from_ptr(msg).to_string_lossy().into_owned();
        ty_free_message(msg);
        s
    };
    Err(TchError::Torch(text))
}

fn c_path(path: &Path) -> Result<CString, TchError> {
    CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| TchError::FileFormat(format!("{}: a NUL in the path", path.display())))
}

extern "C" fn push_named(data: *mut c_void, name: *const c_char, t: *mut C_tensor) {
    // SAFETY: `data` is the `Vec` `named` passed in, alive for the call;
    // `name` is a NUL-terminated string of the shim's; `t` is a new tensor
    // handle whose ownership passes to the `Tensor`.
    unsafe {
        let out = &mut *data.cast::<Vec<(String, Tensor)>>();
        let name = CStr::from_ptr(name).to_string_lossy().into_owned();
        out.push((name, Tensor::from_ptr(t)));
    }
}

/// The forward's signature, as TorchScript compiled it.
#[derive(Debug, Clone)]
pub struct Schema {
    /// E.g. `forward(__torch__.Net self, Tensor x) -> Tensor`.
    pub text: String,
    /// Arguments besides `self`.
    pub args: usize,
    /// Their names, in order.
    pub names: Vec<String>,
    /// Of which tensors.
    pub tensor_args: usize,
    /// Whether it returns one tensor.
    pub returns_tensor: bool,
}

/// A loaded TorchScript module.
pub struct Module {
    ptr: *mut c_void,
}

// SAFETY: a `torch::jit::Module` is a handle to reference-counted state;
// the executor uses each module from one thread at a time (it is owned by
// one replica, or by inspection), which is what libtorch requires.
unsafe impl Send for Module {}

impl Drop for Module {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `ty_load` and is freed once, here.
        unsafe { ty_free(self.ptr) }
    }
}

impl Module {
    /// Loads the TorchScript file at `path` onto `device`.
    pub fn load(path: &Path, device: Device) -> Result<Module, TchError> {
        let path = c_path(path)?;
        let index = match device {
            Device::Cuda(i) => i as c_int,
            _ => -1,
        };
        let mut ptr = std::ptr::null_mut();
        // SAFETY: valid C string; `ptr` is written only on success.
        checked(unsafe { ty_load(path.as_ptr(), index, &mut ptr) })?;
        Ok(Module { ptr })
    }

    fn named(&self, buffers: bool) -> Result<Vec<(String, Tensor)>, TchError> {
        let mut out: Vec<(String, Tensor)> = Vec::new();
        // SAFETY: the callback receives `out` for the duration of the call.
        checked(unsafe {
            ty_named(
                self.ptr,
                c_int::from(buffers),
                (&mut out as *mut Vec<(String, Tensor)>).cast(),
                push_named,
            )
        })?;
        Ok(out)
    }

    /// Every parameter with its dotted name, in the module's order; a
    /// parameter shared by two submodules appears under both names.
    pub fn parameters(&self) -> Result<Vec<(String, Tensor)>, TchError> {
        self.named(false)
    }

    /// Every buffer with its dotted name, in the module's order.
    pub fn buffers(&self) -> Result<Vec<(String, Tensor)>, TchError> {
        self.named(true)
    }

    /// Training mode (dropout on, BatchNorm on batch statistics and
    /// updating its running ones) or evaluation mode.
    pub fn set_train(&self, on: bool) -> Result<(), TchError> {
        // SAFETY: a live module.
        checked(unsafe { ty_train(self.ptr, c_int::from(on)) })
    }

    /// The forward's signature.
    pub fn schema(&self) -> Result<Schema, TchError> {
        let (mut text, mut names, mut tensor_args, mut args, mut returns) =
            (std::ptr::null_mut(), std::ptr::null_mut(), 0, 0, 0);
        // SAFETY: out-pointers to locals; `text` and `names` are malloc'd
        // strings.
        checked(unsafe {
            ty_forward_schema(
                self.ptr,
                &mut text,
                &mut names,
                &mut tensor_args,
                &mut args,
                &mut returns,
            )
        })?;
        let owned = |p: *mut c_char| {
            if p.is_null() {
                String::new()
            } else {
                // SAFETY: as in `checked`.
                unsafe {
                    let s = CStr::from_ptr(p).to_string_lossy().into_owned();
                    ty_free_message(p);
                    s
                }
            }
        };
        let (text, names) = (owned(text), owned(names));
        Ok(Schema {
            text,
            args: args.max(0) as usize,
            names: names.lines().map(str::to_owned).collect(),
            tensor_args: tensor_args.max(0) as usize,
            returns_tensor: returns != 0,
        })
    }

    /// The forward on one tensor; an error unless it returns a tensor.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor, TchError> {
        let mut out = std::ptr::null_mut();
        // SAFETY: `x` outlives the call; `out` is a new handle on success.
        checked(unsafe { ty_forward(self.ptr, x.as_ptr(), &mut out) })?;
        // SAFETY: ownership of the new handle passes to the `Tensor`.
        Ok(unsafe { Tensor::from_ptr(out) })
    }

    /// The forward on several tensors, one per argument.
    pub fn forward_many(&self, xs: &[Tensor]) -> Result<Tensor, TchError> {
        let ptrs: Vec<*const C_tensor> = xs.iter().map(|x| x.as_ptr()).collect();
        let mut out = std::ptr::null_mut();
        // SAFETY: `xs` (and so each handle) outlives the call; `out` is a
        // new handle on success.
        checked(unsafe {
            ty_forward_many(self.ptr, ptrs.as_ptr(), ptrs.len() as c_int, &mut out)
        })?;
        // SAFETY: ownership of the new handle passes to the `Tensor`.
        Ok(unsafe { Tensor::from_ptr(out) })
    }

    /// The forward on a batch as the data layer packs it: one tensor for
    /// a forward of one tensor argument; for `inputs` > 1 arguments, the
    /// inputs stacked along dimension 1 (`[n, inputs, …]`, from
    /// `dataset.inputs`), handed over one per argument.
    pub fn forward_packed(&self, x: &Tensor, inputs: usize) -> Result<Tensor, TchError> {
        if inputs <= 1 {
            return self.forward(x);
        }
        if x.dim() < 2 || x.size()[1] != inputs as i64 {
            return Err(TchError::Shape(format!(
                "the forward takes {inputs} tensors but the batch (shape {:?}) holds {} inputs: name them in dataset.inputs",
                x.size(),
                if x.dim() < 2 { 1 } else { x.size()[1] }
            )));
        }
        let parts: Vec<Tensor> = (0..inputs as i64).map(|i| x.select(1, i)).collect();
        self.forward_many(&parts)
    }

    /// Writes the module, with its current tensors, to `path`.
    pub fn save(&self, path: &Path) -> Result<(), TchError> {
        let path = c_path(path)?;
        // SAFETY: valid C string; a live module.
        checked(unsafe { ty_save(self.ptr, path.as_ptr()) })
    }
}
