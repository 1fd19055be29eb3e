//! Tensors: a typed, shaped, strided view into a [`Buffer`].

use std::fmt;

use crate::buffer::Buffer;
use crate::device::{Device, MemoryPool};
use crate::dtype::{decode_f32, DType, Element};
use crate::error::{Result, RuntimeError};
use crate::stream::Stream;

/// A view of `shape` elements of `dtype` in a buffer: element `[i0, i1, ...]` lives at
/// element index `offset + i0 * strides[0] + i1 * strides[1] + ...` of the buffer. Strides and
/// offset count elements. Cheap to clone (the buffer is shared).
///
/// Invariant: every element of the view lies inside the buffer.
#[derive(Clone)]
pub struct Tensor {
    dtype: DType,
    shape: Vec<usize>,
    strides: Vec<usize>,
    offset: usize,
    buffer: Buffer,
}

/// Row-major strides for `shape`.
fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1].max(1);
    }
    strides
}

/// The element count of `shape`, or an error when it overflows.
fn numel_of(op: &str, shape: &[usize]) -> Result<usize> {
    shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .ok_or_else(|| RuntimeError::Shape(format!("{op}: shape {shape:?} has more elements than fit in memory")))
}

fn bytes_of(op: &str, shape: &[usize], dtype: DType) -> Result<usize> {
    numel_of(op, shape)?
        .checked_mul(dtype.size())
        .ok_or_else(|| RuntimeError::Shape(format!("{op}: shape {shape:?} of {dtype} is larger than memory")))
}

impl Tensor {
    /// A tensor holding a copy of `data` with `shape` (row-major), on the device's default
    /// stream.
    pub fn from_slice<T: Element>(device: &Device, data: &[T], shape: &[usize]) -> Result<Tensor> {
        Tensor::from_slice_on(&device.default_stream(), data, shape)
    }

    /// [`Tensor::from_slice`], allocated and copied in `stream`'s order.
    pub fn from_slice_on<T: Element>(stream: &Stream, data: &[T], shape: &[usize]) -> Result<Tensor> {
        let numel = numel_of("Tensor::from_slice", shape)?;
        if numel != data.len() {
            return Err(RuntimeError::Shape(format!(
                "Tensor::from_slice: shape {shape:?} has {numel} elements but the data has {}",
                data.len()
            )));
        }
        let mut bytes = Vec::with_capacity(data.len() * T::DTYPE.size());
        for &v in data {
            v.write_le(&mut bytes);
        }
        Tensor::from_bytes_on(stream, T::DTYPE, shape, &bytes)
    }

    /// A tensor from its row-major little-endian bytes (as safetensors stores them), on the
    /// device's default stream.
    pub fn from_bytes(device: &Device, dtype: DType, shape: &[usize], bytes: &[u8]) -> Result<Tensor> {
        Tensor::from_bytes_on(&device.default_stream(), dtype, shape, bytes)
    }

    /// [`Tensor::from_bytes`], allocated and copied in `stream`'s order.
    pub fn from_bytes_on(stream: &Stream, dtype: DType, shape: &[usize], bytes: &[u8]) -> Result<Tensor> {
        let want = bytes_of("Tensor::from_bytes", shape, dtype)?;
        if want != bytes.len() {
            return Err(RuntimeError::Shape(format!(
                "Tensor::from_bytes: shape {shape:?} of {dtype} needs {want} bytes, {} were given",
                bytes.len()
            )));
        }
        Ok(Tensor::contiguous(dtype, shape, Buffer::from_bytes_on(stream, bytes)?))
    }

    /// A zero-filled tensor, on the device's default stream. Its memory comes from the device's
    /// caching allocator, so a tensor allocated every step does not call the driver.
    pub fn zeros(device: &Device, dtype: DType, shape: &[usize]) -> Result<Tensor> {
        Tensor::zeros_on(&device.default_stream(), dtype, shape)
    }

    /// [`Tensor::zeros`], allocated and zeroed in `stream`'s order.
    pub fn zeros_on(stream: &Stream, dtype: DType, shape: &[usize]) -> Result<Tensor> {
        let bytes = bytes_of("Tensor::zeros", shape, dtype)?;
        Ok(Tensor::contiguous(dtype, shape, Buffer::zeros_on(stream, bytes)?))
    }

    /// A tensor of unspecified content (zeros on the CPU), for outputs a kernel overwrites, on
    /// the device's default stream (from the caching allocator, as [`Tensor::zeros`]).
    pub fn empty(device: &Device, dtype: DType, shape: &[usize]) -> Result<Tensor> {
        Tensor::empty_on(&device.default_stream(), dtype, shape)
    }

    /// [`Tensor::empty`], usable in `stream`'s order.
    pub fn empty_on(stream: &Stream, dtype: DType, shape: &[usize]) -> Result<Tensor> {
        let bytes = bytes_of("Tensor::empty", shape, dtype)?;
        Ok(Tensor::contiguous(dtype, shape, Buffer::uninit_on(stream, bytes)?))
    }

    /// [`Tensor::empty_on`] in a private memory pool ([`crate::Device::create_memory_pool`]).
    pub fn empty_in(pool: &MemoryPool, stream: &Stream, dtype: DType, shape: &[usize]) -> Result<Tensor> {
        let bytes = bytes_of("Tensor::empty_in", shape, dtype)?;
        Ok(Tensor::contiguous(dtype, shape, Buffer::uninit_in(pool, stream, bytes)?))
    }

    fn contiguous(dtype: DType, shape: &[usize], buffer: Buffer) -> Tensor {
        Tensor { dtype, shape: shape.to_vec(), strides: contiguous_strides(shape), offset: 0, buffer }
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The sizes of the dimensions (the same as [`Tensor::shape`]).
    pub fn dims(&self) -> &[usize] {
        &self.shape
    }

    /// The number of dimensions.
    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// The size of dimension `d`.
    pub fn dim(&self, d: usize) -> Result<usize> {
        self.shape.get(d).copied().ok_or_else(|| {
            RuntimeError::Shape(format!("dimension {d} of a tensor of shape {:?} (rank {})", self.shape, self.rank()))
        })
    }

    /// Element strides, one per dimension.
    pub fn strides(&self) -> &[usize] {
        &self.strides
    }

    /// Element offset of the first element in the buffer.
    pub fn offset(&self) -> usize {
        self.offset
    }

    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn device(&self) -> &Device {
        self.buffer.device()
    }

    pub fn buffer(&self) -> &Buffer {
        &self.buffer
    }

    /// Whether the elements are row-major and dense (strides of size-1 dimensions do not matter).
    pub fn is_contiguous(&self) -> bool {
        if self.numel() == 0 {
            return true;
        }
        let mut expected = 1;
        for (&d, &s) in self.shape.iter().zip(&self.strides).rev() {
            if d != 1 && s != expected {
                return false;
            }
            expected *= d;
        }
        true
    }

    /// Bytes from the first element to just past the last one (0 for an empty tensor).
    pub(crate) fn span_bytes(&self) -> usize {
        if self.numel() == 0 {
            return 0;
        }
        let last: usize = self.shape.iter().zip(&self.strides).map(|(&d, &s)| (d - 1) * s).sum();
        (last + 1) * self.dtype.size()
    }

    /// The same elements with another shape of the same element count. Contiguous tensors only.
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor> {
        let numel = numel_of("Tensor::reshape", shape)?;
        if numel != self.numel() {
            return Err(RuntimeError::Shape(format!(
                "Tensor::reshape: cannot view shape {:?} ({} elements) as {shape:?} ({numel} elements)",
                self.shape,
                self.numel()
            )));
        }
        if !self.is_contiguous() {
            return Err(RuntimeError::Shape(format!(
                "Tensor::reshape: the tensor of shape {:?} with strides {:?} is not contiguous",
                self.shape, self.strides
            )));
        }
        Ok(Tensor { shape: shape.to_vec(), strides: contiguous_strides(shape), ..self.clone() })
    }

    /// The view of elements `start..start + len` along dimension `dim` (no copy).
    pub fn narrow(&self, dim: usize, start: usize, len: usize) -> Result<Tensor> {
        let size = self.dim(dim)?;
        if !matches!(start.checked_add(len), Some(end) if end <= size) {
            return Err(RuntimeError::Shape(format!(
                "Tensor::narrow: elements {start}..{} of dimension {dim} of shape {:?}",
                start.saturating_add(len),
                self.shape
            )));
        }
        let mut t = self.clone();
        t.shape[dim] = len;
        if len > 0 {
            t.offset += start * self.strides[dim];
        }
        Ok(t)
    }

    /// Overwrite the elements (row-major) with `data`, which must have `numel` elements of this
    /// tensor's dtype. Contiguous tensors only. On CUDA the copy is ordered after earlier work
    /// on the buffer's stream ([`Buffer::stream`]).
    pub fn copy_from_slice<T: Element>(&self, data: &[T]) -> Result<()> {
        self.copy_from_slice_on(&self.buffer.stream(), data)
    }

    /// [`Tensor::copy_from_slice`], queued on `stream`.
    pub fn copy_from_slice_on<T: Element>(&self, stream: &Stream, data: &[T]) -> Result<()> {
        self.check_dtype("Tensor::copy_from_slice", T::DTYPE)?;
        if data.len() != self.numel() {
            return Err(RuntimeError::Shape(format!(
                "Tensor::copy_from_slice: {} elements into a tensor of shape {:?}",
                data.len(),
                self.shape
            )));
        }
        if !self.is_contiguous() {
            return Err(RuntimeError::Shape(format!(
                "Tensor::copy_from_slice: the tensor of shape {:?} with strides {:?} is not contiguous",
                self.shape, self.strides
            )));
        }
        let mut bytes = Vec::with_capacity(data.len() * self.dtype.size());
        for &x in data {
            x.write_le(&mut bytes);
        }
        self.buffer.write_on(stream, self.offset * self.dtype.size(), &bytes)
    }

    fn check_dtype(&self, op: &str, dtype: DType) -> Result<()> {
        if self.dtype != dtype {
            return Err(RuntimeError::DType {
                op: op.into(),
                expected: dtype.to_string(),
                got: self.dtype.to_string(),
            });
        }
        Ok(())
    }

    /// The elements in row-major order, as little-endian bytes, read on the buffer's stream
    /// ([`Buffer::stream`]), which this synchronises. Data written on another stream needs
    /// [`Tensor::to_bytes_on`] with that stream, or an event.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        self.to_bytes_on(&self.buffer.stream())
    }

    /// The elements in row-major order, read in `stream`'s order; synchronises `stream`.
    pub fn to_bytes_on(&self, stream: &Stream) -> Result<Vec<u8>> {
        let size = self.dtype.size();
        let start = self.offset * size;
        let raw = self.buffer.read_on(stream, start..start + self.span_bytes())?;
        if self.is_contiguous() {
            return Ok(raw);
        }
        let numel = self.numel();
        let mut out = Vec::with_capacity(numel * size);
        let mut index = vec![0usize; self.rank()];
        for _ in 0..numel {
            let e: usize = index.iter().zip(&self.strides).map(|(i, s)| i * s).sum();
            out.extend_from_slice(&raw[e * size..(e + 1) * size]);
            // Advance the row-major multi-index.
            for d in (0..index.len()).rev() {
                index[d] += 1;
                if index[d] < self.shape[d] {
                    break;
                }
                index[d] = 0;
            }
        }
        Ok(out)
    }

    /// The elements in row-major order; `T` must be this tensor's dtype. Read on the buffer's
    /// stream, as [`Tensor::to_bytes`].
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        self.to_vec_on(&self.buffer.stream())
    }

    /// [`Tensor::to_vec`] read in `stream`'s order; synchronises `stream`.
    pub fn to_vec_on<T: Element>(&self, stream: &Stream) -> Result<Vec<T>> {
        self.check_dtype("Tensor::to_vec", T::DTYPE)?;
        let bytes = self.to_bytes_on(stream)?;
        Ok(bytes.chunks_exact(T::DTYPE.size()).filter_map(T::read_le).collect())
    }

    /// The elements in row-major order converted to `f32` (any float dtype).
    pub fn to_f32_vec(&self) -> Result<Vec<f32>> {
        if !self.dtype.is_float() {
            return Err(RuntimeError::DType {
                op: "Tensor::to_f32_vec".into(),
                expected: "a float dtype (f32, f16, bf16, f64)".into(),
                got: self.dtype.to_string(),
            });
        }
        let bytes = self.to_bytes()?;
        Ok(bytes.chunks_exact(self.dtype.size()).filter_map(|b| decode_f32(self.dtype, b)).collect())
    }

    /// A contiguous copy on `device`.
    pub fn to_device(&self, device: &Device) -> Result<Tensor> {
        Tensor::from_bytes(device, self.dtype, &self.shape, &self.to_bytes()?)
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Tensor({} {:?} on {}", self.dtype, self.shape, self.device())?;
        if !self.is_contiguous() || self.offset != 0 {
            write!(f, ", strides {:?}, offset {}", self.strides, self.offset)?;
        }
        f.write_str(")")
    }
}
