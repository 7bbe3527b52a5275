// ckptdb._native: the walk of ckptdb.torch's save in native code (issue 23).
//
// A save of a state dict of thousands of small tensors spent about 3.5 us a tensor in Python:
// the walk of the nested dicts and lists, the JSON of the tree record and the packing of the
// ckptdb_put_shards descriptors. walk() does all three in one pass over the state, with the
// interpreter's C API, and returns the descriptors ready for one ckptdb_put_shards call.
//
// It writes the same bytes as the Python walk (Checkpointer._flatten + json.dumps with
// separators (",", ":") and ensure_ascii), which python/tests/test_torch.py checks on every kind
// of value; the Python walk stays for interpreters without this module. Values it does not know
// (what only pickle can save, or what is refused) go to the caller's `fallback(obj, path)`,
// which returns the leaf's JSON text or raises.
//
// The module knows the C API's structures from its header and nothing of the engine: the
// library is called from Python (ctypes), with the buffer this returns.

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "ckptdb/ckptdb.h"

#ifdef CKPTDB_NATIVE_ATEN
// Built against the torch that runs it (Debian's libtorch-dev, with python3-torch): tensors of
// the exact types torch.Tensor and nn.Parameter are read through ATen, without making a Python
// object for their dtype, device, shape, contiguity or address.
#include <torch/csrc/Dtype.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/version.h>
#endif

// A check that stays on in release builds: a broken one is a bug in this file.
#define CKPTDB_NATIVE_ASSERT(cond)                                                           \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      std::fprintf(stderr, "ckptdb._native: %s:%d: %s failed\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                          \
    }                                                                                        \
  } while (0)

namespace {

// An owned reference, released on every path out.
class Ref {
 public:
  Ref() = default;
  explicit Ref(PyObject* object) : object_(object) {}
  ~Ref() { Py_XDECREF(object_); }
  Ref(const Ref&) = delete;
  Ref& operator=(const Ref&) = delete;
  Ref(Ref&& other) noexcept : object_(other.object_) { other.object_ = nullptr; }
  Ref& operator=(Ref&& other) noexcept {
    if (this != &other) {
      Py_XDECREF(object_);
      object_ = other.object_;
      other.object_ = nullptr;
    }
    return *this;
  }

  static Ref Borrowed(PyObject* object) {
    Py_XINCREF(object);
    return Ref(object);
  }
  PyObject* get() const { return object_; }
  PyObject* release() {
    PyObject* object = object_;
    object_ = nullptr;
    return object;
  }
  explicit operator bool() const { return object_ != nullptr; }

 private:
  PyObject* object_ = nullptr;
};

// Set once by configure(): torch.Tensor, ckptdb.torch.Shard, the dtype table, the tree's name.
struct Config {
  PyTypeObject* tensor_type = nullptr;
  PyTypeObject* shard_type = nullptr;
  PyObject* dtypes = nullptr;  // {torch.dtype: (name str, ckptdb dtype code, element size)}
  std::string tree_name;
  long tree_format = 0;
#ifdef CKPTDB_NATIVE_ATEN
  bool aten = false;                 // the torch running is the one this was built against
  std::vector<PyObject*> aten_rows;  // by c10::ScalarType: dtypes' rows (borrowed), or null
#endif
};
Config config;

// Attribute names, interned once.
struct Names {
  PyObject* dtype;
  PyObject* is_cuda;
  PyObject* is_cpu;
  PyObject* device;
  PyObject* is_contiguous;
  PyObject* is_neg;
  PyObject* resolve_neg;
  PyObject* detach;
  PyObject* contiguous;
  PyObject* data_ptr;
  PyObject* shape;
  PyObject* items;
  PyObject* hex;
  PyObject* tensor;
  PyObject* global_shape;
  PyObject* offset;
};
Names names;

bool InternNames() {
  struct Entry {
    PyObject** slot;
    const char* text;
  };
  const Entry entries[] = {
      {&names.dtype, "dtype"},
      {&names.is_cuda, "is_cuda"},
      {&names.is_cpu, "is_cpu"},
      {&names.device, "device"},
      {&names.is_contiguous, "is_contiguous"},
      {&names.is_neg, "is_neg"},
      {&names.resolve_neg, "resolve_neg"},
      {&names.detach, "detach"},
      {&names.contiguous, "contiguous"},
      {&names.data_ptr, "data_ptr"},
      {&names.shape, "shape"},
      {&names.items, "items"},
      {&names.hex, "hex"},
      {&names.tensor, "tensor"},
      {&names.global_shape, "global_shape"},
      {&names.offset, "offset"},
  };
  for (const Entry& entry : entries) {
    *entry.slot = PyUnicode_InternFromString(entry.text);
    if (*entry.slot == nullptr) {
      return false;
    }
  }
  return true;
}

constexpr char kHex[] = "0123456789abcdef";

void AppendEscape(std::string& out, uint32_t unit) {  // \uXXXX, lower-case as json writes it
  char text[6] = {'\\',
                  'u',
                  kHex[(unit >> 12) & 0xf],
                  kHex[(unit >> 8) & 0xf],
                  kHex[(unit >> 4) & 0xf],
                  kHex[unit & 0xf]};
  out.append(text, sizeof(text));
}

// One code point as json.dumps(ensure_ascii=True) writes it inside a string.
void AppendCodePoint(std::string& out, uint32_t c) {
  if (c >= 0x20 && c <= 0x7e) {
    if (c == '"' || c == '\\') {
      out.push_back('\\');
    }
    out.push_back(static_cast<char>(c));
    return;
  }
  // The control characters json writes in short form.
  static constexpr struct {
    uint32_t c;
    const char* text;
  } kShort[] = {{'\b', "\\b"}, {'\f', "\\f"}, {'\n', "\\n"}, {'\r', "\\r"}, {'\t', "\\t"}};
  for (const auto& s : kShort) {
    if (c == s.c) {
      out.append(s.text);
      return;
    }
  }
  if (c >= 0x10000) {  // a surrogate pair
    const uint32_t v = c - 0x10000;
    AppendEscape(out, 0xd800 | ((v >> 10) & 0x3ff));
    AppendEscape(out, 0xdc00 | (v & 0x3ff));
    return;
  }
  AppendEscape(out, c);
}

// Printable ASCII but '"' and '\\': the bytes json writes as they are.
inline bool Plain(unsigned char c) { return c >= 0x20 && c <= 0x7e && c != '"' && c != '\\'; }

// ASCII bytes, quoted: runs of plain bytes appended at once (names are mostly such runs).
void AppendJsonAscii(std::string& out, const unsigned char* data, size_t length) {
  out.push_back('"');
  size_t run = 0;
  for (size_t i = 0; i < length; ++i) {
    if (!Plain(data[i])) {
      out.append(reinterpret_cast<const char*>(data) + run, i - run);
      AppendCodePoint(out, data[i]);
      run = i + 1;
    }
  }
  out.append(reinterpret_cast<const char*>(data) + run, length - run);
  out.push_back('"');
}

// A str, quoted. Read by code point, so a lone surrogate is written as json writes it.
void AppendJsonString(std::string& out, PyObject* text) {
  const Py_ssize_t length = PyUnicode_GET_LENGTH(text);
  if (PyUnicode_IS_ASCII(text)) {
    AppendJsonAscii(out, static_cast<const unsigned char*>(PyUnicode_DATA(text)),
                    static_cast<size_t>(length));
    return;
  }
  out.push_back('"');
  const int kind = PyUnicode_KIND(text);
  const void* data = PyUnicode_DATA(text);
  for (Py_ssize_t i = 0; i < length; ++i) {
    AppendCodePoint(out, PyUnicode_READ(kind, data, i));
  }
  out.push_back('"');
}

// A valid UTF-8 string (a path this walk built from str), quoted.
void AppendJsonUtf8(std::string& out, std::string_view text) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(text.data());
  bool ascii = true;
  for (size_t i = 0; i < text.size() && ascii; ++i) {
    ascii = bytes[i] < 0x80;
  }
  if (ascii) {
    AppendJsonAscii(out, bytes, text.size());
    return;
  }
  out.push_back('"');
  for (size_t i = 0; i < text.size();) {
    const auto lead = static_cast<unsigned char>(text[i]);
    uint32_t c = lead;
    size_t width = 1;
    if (lead >= 0xf0) {
      c = lead & 0x07;
      width = 4;
    } else if (lead >= 0xe0) {
      c = lead & 0x0f;
      width = 3;
    } else if (lead >= 0xc0) {
      c = lead & 0x1f;
      width = 2;
    }
    for (size_t k = 1; k < width && i + k < text.size(); ++k) {
      c = (c << 6) | (static_cast<unsigned char>(text[i + k]) & 0x3f);
    }
    AppendCodePoint(out, c);
    i += width;
  }
  out.push_back('"');
}

// Whether UTF-8 bytes (encoded with surrogatepass) hold a surrogate (ED A0..BF ..).
bool HasSurrogate(std::string_view text) {
  for (size_t i = 0; i + 1 < text.size(); ++i) {
    if (static_cast<unsigned char>(text[i]) == 0xed &&
        static_cast<unsigned char>(text[i + 1]) >= 0xa0) {
      return true;
    }
  }
  return false;
}

void AppendUnsigned(std::string& out, uint64_t value) {
  char text[24];
  size_t at = sizeof(text);
  do {
    text[--at] = static_cast<char>('0' + value % 10);
    value /= 10;
  } while (value != 0);
  out.append(text + at, sizeof(text) - at);
}

// A str's UTF-8 bytes as they are (text already JSON).
bool AppendUtf8(std::string& out, PyObject* text) {
  Py_ssize_t size = 0;
  const char* data = PyUnicode_AsUTF8AndSize(text, &size);
  if (data == nullptr) {
    return false;
  }
  out.append(data, static_cast<size_t>(size));
  return true;
}

// An int as json writes it (int.__repr__, so for subclasses too); any size.
bool AppendJsonInt(std::string& out, PyObject* value) {
  int overflow = 0;
  const long long small = PyLong_AsLongLongAndOverflow(value, &overflow);
  if (overflow == 0) {
    if (small == -1 && PyErr_Occurred()) {
      return false;
    }
    if (small < 0) {
      out.push_back('-');
      AppendUnsigned(out, 0 - static_cast<uint64_t>(small));
    } else {
      AppendUnsigned(out, static_cast<uint64_t>(small));
    }
    return true;
  }
  Ref text(PyLong_Type.tp_repr(value));
  return text && AppendUtf8(out, text.get());
}

// A tuple of ints (a torch.Size, a Shard's global_shape or offset) into dims[], at most
// CKPTDB_MAX_DIMS of them.
bool ReadDims(PyObject* tuple, std::string_view name, uint64_t* dims, uint32_t* ndim) {
  if (!PyTuple_Check(tuple)) {
    PyErr_Format(PyExc_TypeError, "%s: a shape of type %s, not a tuple", std::string(name).c_str(),
                 Py_TYPE(tuple)->tp_name);
    return false;
  }
  const Py_ssize_t count = PyTuple_GET_SIZE(tuple);
  if (count > CKPTDB_MAX_DIMS) {
    PyErr_Format(PyExc_ValueError, "%s: shape %R: at most %d dimensions", std::string(name).c_str(),
                 tuple, CKPTDB_MAX_DIMS);
    return false;
  }
  for (Py_ssize_t d = 0; d < count; ++d) {
    const unsigned long long value = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(tuple, d));
    if (value == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
      return false;
    }
    dims[d] = value;
  }
  *ndim = static_cast<uint32_t>(count);
  return true;
}

// One tensor to put: where its name lies in the names buffer, its memory and its info.
struct Entry {
  size_t name_at;
  uintptr_t data;
  uint64_t nbytes;
  unsigned flags;
};

// What a walk writes, owned by the capsule it returns until the put has read it. One set is kept
// for the next walk: its capacity and its pages are there already (a state of 50,000 tensors
// makes about 12 MB of them; a fresh allocation costs page faults on every save).
struct Buffers {
  std::string json;   // the tree record
  std::string names;  // NUL-terminated, the record's first
  std::vector<ckptdb_tensor_info> infos;
  std::vector<Entry> entries;
  std::vector<ckptdb_shard> descs;

  void Clear() {
    json.clear();
    names.clear();
    infos.clear();
    entries.clear();
    descs.clear();
  }
  size_t Capacity() const {
    return json.capacity() + names.capacity() + infos.capacity() * sizeof(ckptdb_tensor_info) +
           entries.capacity() * sizeof(Entry) + descs.capacity() * sizeof(ckptdb_shard);
  }
};

constexpr const char* kCapsule = "ckptdb._native.buffers";
constexpr size_t kSpareLimit = size_t{256} << 20;  // a larger set is freed, not kept
Buffers* spare = nullptr;                          // touched with the GIL held only

Buffers* TakeBuffers() {
  Buffers* buffers = spare;
  spare = nullptr;
  if (buffers == nullptr) {
    return new Buffers;
  }
  buffers->Clear();
  return buffers;
}

void GiveBack(Buffers* buffers) {
  if (spare == nullptr && buffers->Capacity() <= kSpareLimit) {
    spare = buffers;
  } else {
    delete buffers;
  }
}

void FreeCapsule(PyObject* capsule) {
  GiveBack(static_cast<Buffers*>(PyCapsule_GetPointer(capsule, kCapsule)));
}

// Where a save puts its shards as it walks: ckptdb_put_shards and ckptdb_abort of the library
// the caller loaded (their addresses come from ctypes), its handle and the version.
using PutFn = int (*)(void* db, uint64_t version, const ckptdb_shard* shards, size_t count);
using AbortFn = int (*)(void* db, uint64_t version);
struct Sink {
  PutFn put = nullptr;
  AbortFn abort = nullptr;
  void* db = nullptr;
  uint64_t version = 0;
  size_t batch = 0;          // tensors a put
  PyObject* sync = nullptr;  // sync(device): before the first put of that CUDA device's memory
};

class Walk {
 public:
  explicit Walk(PyObject* fallback, const Sink* sink = nullptr)
      : fallback_(fallback),
        sink_(sink),
        buffers_(TakeBuffers()),
        json_(buffers_->json),
        names_(buffers_->names),
        infos_(buffers_->infos),
        entries_(buffers_->entries) {}
  ~Walk() {
    if (buffers_ != nullptr) {
      GiveBack(buffers_);
    }
  }
  Walk(const Walk&) = delete;
  Walk& operator=(const Walk&) = delete;

  bool Start() {
    keep_ = Ref(PyList_New(0));
    devices_ = Ref(PyList_New(0));
    return keep_ && devices_;
  }

  // The whole state, as the value of the record's "tree".
  bool Node(PyObject* object) {
    if (Py_EnterRecursiveCall(" in ckptdb.torch's save")) {
      return false;
    }
    struct Leave {  // also when a C++ exception unwinds through here
      ~Leave() { Py_LeaveRecursiveCall(); }
    } leave;
    return NodeOf(object);
  }

  std::string& json() { return json_; }

  // Puts the tensors walked since the last put (and the record, at the end), the GIL released
  // meanwhile: capture copies them while the walk goes on. False with no Python error when the
  // put failed (status()), with one when a sync failed.
  bool Flush(bool with_record) {
    std::vector<ckptdb_shard>& descs = buffers_->descs;
    descs.clear();
    for (size_t i = flushed_; i < entries_.size(); ++i) {
      const Entry& e = entries_[i];
      descs.push_back(ckptdb_shard{names_.data() + e.name_at, reinterpret_cast<const void*>(e.data),
                                   e.nbytes, &infos_[i], e.flags});
    }
    if (with_record) {
      descs.push_back(
          ckptdb_shard{names_.data(), json_.data(), json_.size(), nullptr, CKPTDB_PUT_COPY_NOW});
    }
    flushed_ = entries_.size();
    if (descs.empty()) {
      return true;
    }
    int status = 0;
    Py_BEGIN_ALLOW_THREADS;
    status = sink_->put(sink_->db, sink_->version, descs.data(), descs.size());
    Py_END_ALLOW_THREADS;
    if (status != 0) {  // all or nothing: this call put nothing
      status_ = status;
      return false;
    }
    put_any_ = true;
    return true;
  }

  int status() const { return status_; }

  // After a Python error: the shards already put are dropped (the version aborted, so nothing
  // of a failed save stays), before the tensors they read are let go. The error is kept.
  void AbortIfPut() {
    if (!put_any_) {
      return;
    }
    PyObject* type = nullptr;
    PyObject* value = nullptr;
    PyObject* traceback = nullptr;
    PyErr_Fetch(&type, &value, &traceback);
    Py_BEGIN_ALLOW_THREADS;
    sink_->abort(sink_->db, sink_->version);
    Py_END_ALLOW_THREADS;
    PyErr_Restore(type, value, traceback);
  }

  // (status, tensors to keep alive until capture ends) of a walk that put as it went. A failed
  // put's version is the caller's to abort: even a first put may have queued lazy shards.
  PyObject* FinishPut() {
    PyObject* result = Py_BuildValue("(iO)", status_, keep_.get());
    if (result == nullptr) {
      AbortIfPut();  // before keep_ lets the tensors go
    }
    return result;
  }

  // The put's descriptors, the first the record's, pointing into the buffers. Returns (a
  // capsule owning the buffers, the descriptors' address, their count, the tensors to keep alive
  // until capture ends, the CUDA devices to synchronize first).
  PyObject* Finish() {
    std::vector<ckptdb_shard>& descs = buffers_->descs;
    descs.reserve(entries_.size() + 1);
    descs.push_back(
        ckptdb_shard{names_.data(), json_.data(), json_.size(), nullptr, CKPTDB_PUT_COPY_NOW});
    for (size_t i = 0; i < entries_.size(); ++i) {
      const Entry& e = entries_[i];
      descs.push_back(ckptdb_shard{names_.data() + e.name_at, reinterpret_cast<const void*>(e.data),
                                   e.nbytes, &infos_[i], e.flags});
    }
    Ref capsule(PyCapsule_New(buffers_, kCapsule, FreeCapsule));
    if (!capsule) {
      return nullptr;
    }
    buffers_ = nullptr;  // the capsule's now
    return Py_BuildValue("(NKnNN)", capsule.release(),
                         static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(descs.data())),
                         static_cast<Py_ssize_t>(descs.size()), keep_.release(),
                         devices_.release());
  }

  void StartNames(const std::string& tree_name) {
    names_.append(tree_name);
    names_.push_back('\0');
  }

 private:
  // Its name as Checkpointer._flatten gives it: the path, "/" for the root.
  std::string_view NameView() const {
    return path_.empty() ? std::string_view("/") : std::string_view(path_);
  }
  std::string Name() const { return std::string(NameView()); }

  bool NodeOf(PyObject* object) {
    // Tensors first: a state dict is mostly tensors.
    if (PyObject_TypeCheck(object, config.tensor_type)) {
      return TensorLeaf(object, nullptr);
    }
    if (PyObject_TypeCheck(object, config.shard_type)) {
      Ref tensor(PyObject_GetAttr(object, names.tensor));
      if (!tensor) {
        return false;
      }
      if (!PyObject_TypeCheck(tensor.get(), config.tensor_type)) {
        PyErr_Format(PyExc_TypeError, "%s: a Shard of a %s", Name().c_str(),
                     Py_TYPE(tensor.get())->tp_name);
        return false;
      }
      return TensorLeaf(tensor.get(), object);
    }
    if (PyDict_Check(object)) {
      return DictNode(object);
    }
    if (PyList_Check(object) || PyTuple_Check(object)) {
      return SequenceNode(object);
    }
    if (object == Py_None) {
      json_.append("{\"v\":null}");
      return true;
    }
    if (PyBool_Check(object)) {
      json_.append(object == Py_True ? "{\"v\":true}" : "{\"v\":false}");
      return true;
    }
    if (PyUnicode_Check(object)) {
      json_.append("{\"v\":");
      AppendJsonString(json_, object);
      json_.push_back('}');
      return true;
    }
    if (PyLong_Check(object)) {  // {"i": str(obj)}: any size
      Ref text(PyObject_Str(object));
      if (!text) {
        return false;
      }
      json_.append("{\"i\":");
      AppendJsonString(json_, text.get());
      json_.push_back('}');
      return true;
    }
    if (PyFloat_Check(object)) {  // {"f": obj.hex()}: bit for bit, NaN and infinities included
      Ref text(PyObject_CallMethodNoArgs(object, names.hex));
      if (!text) {
        return false;
      }
      if (!PyUnicode_Check(text.get())) {
        PyErr_Format(PyExc_TypeError, "%s: hex() of a %s gave a %s", Name().c_str(),
                     Py_TYPE(object)->tp_name, Py_TYPE(text.get())->tp_name);
        return false;
      }
      json_.append("{\"f\":");
      AppendJsonString(json_, text.get());
      json_.push_back('}');
      return true;
    }
    return Fallback(object);
  }

  // The caller's say on anything else: pickled, or refused.
  bool Fallback(PyObject* object) {
    Ref path(PyUnicode_DecodeUTF8(path_.data(), static_cast<Py_ssize_t>(path_.size()), nullptr));
    if (!path) {
      return false;
    }
    Ref text(PyObject_CallFunctionObjArgs(fallback_, object, path.get(), nullptr));
    if (!text) {
      return false;
    }
    if (!PyUnicode_Check(text.get())) {
      PyErr_Format(PyExc_TypeError, "%s: the fallback returned a %s, not JSON text", Name().c_str(),
                   Py_TYPE(text.get())->tp_name);
      return false;
    }
    return AppendUtf8(json_, text.get());
  }

  // {"d": [[kind, key, child], ...]}, in the order of its items() (an OrderedDict's own), as
  // the Python walk reads it. Each item is let go before the next: the iterator then reuses
  // its tuple, and a dict changed while walked stops the walk (RuntimeError).
  bool DictNode(PyObject* dict) {
    Ref items(PyObject_CallMethodNoArgs(dict, names.items));
    if (!items) {
      return false;
    }
    Ref iterator(PyObject_GetIter(items.get()));
    if (!iterator) {
      return false;
    }
    json_.append("{\"d\":[");
    bool first = true;
    while (Ref item = Ref(PyIter_Next(iterator.get()))) {
      if (!PyTuple_Check(item.get()) || PyTuple_GET_SIZE(item.get()) != 2) {
        PyErr_Format(PyExc_TypeError, "%s: items() of a %s gave a %s", Name().c_str(),
                     Py_TYPE(dict)->tp_name, Py_TYPE(item.get())->tp_name);
        return false;
      }
      PyObject* key = PyTuple_GET_ITEM(item.get(), 0);
      PyObject* value = PyTuple_GET_ITEM(item.get(), 1);
      const bool is_text = PyUnicode_Check(key);
      if (PyBool_Check(key) || !(is_text || PyLong_Check(key))) {
        Ref type_name(PyType_GetName(Py_TYPE(key)));
        if (type_name) {
          PyErr_Format(PyExc_TypeError, "%s: a key of type %U", Name().c_str(), type_name.get());
        }
        return false;
      }
      if (!first) {
        json_.push_back(',');
      }
      first = false;
      json_.append(is_text ? "[\"s\"," : "[\"i\",");
      Ref key_text;
      if (is_text) {
        AppendJsonString(json_, key);  // json writes a str subclass's own text
        // The path is the Python walk's _escape(str(key)): a subclass's str() may differ.
        key_text = PyUnicode_CheckExact(key) ? Ref::Borrowed(key) : Ref(PyObject_Str(key));
        if (!key_text) {
          return false;
        }
      } else {
        if (!AppendJsonInt(json_, key)) {
          return false;
        }
        key_text = Ref(PyObject_Str(key));
        if (!key_text) {
          return false;
        }
      }
      json_.push_back(',');
      const size_t depth = path_.size();
      if (!AppendKey(key_text.get())) {
        return false;
      }
      const bool ok = Node(value);
      path_.resize(depth);
      if (!ok) {
        return false;
      }
      json_.push_back(']');
    }
    if (PyErr_Occurred()) {  // the iteration's own error (a dict changed while walked)
      return false;
    }
    json_.append("]}");
    return true;
  }

  // "/" and the key with % and / escaped (ckptdb.torch._escape).
  bool AppendKey(PyObject* text) {
    Py_ssize_t size = 0;
    const char* data = PyUnicode_AsUTF8AndSize(text, &size);
    Ref encoded;
    if (data == nullptr) {
      // A lone surrogate: kept (as the Python walk keeps it in the tree), refused only if it
      // ends up in a tensor's name (Emit), where the Python walk's name.encode() fails.
      if (!PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) {
        return false;
      }
      PyErr_Clear();
      encoded = Ref(PyUnicode_AsEncodedString(text, "utf-8", "surrogatepass"));
      if (!encoded) {
        return false;
      }
      data = PyBytes_AS_STRING(encoded.get());
      size = PyBytes_GET_SIZE(encoded.get());
    }
    path_.push_back('/');
    Py_ssize_t run = 0;
    for (Py_ssize_t i = 0; i < size; ++i) {
      if (data[i] == '%' || data[i] == '/') {
        path_.append(data + run, static_cast<size_t>(i - run));
        path_.append(data[i] == '%' ? "%25" : "%2F");
        run = i + 1;
      }
    }
    path_.append(data + run, static_cast<size_t>(size - run));
    return true;
  }

  // {"l": [...]} for a list, {"u": [...]} for a tuple.
  bool SequenceNode(PyObject* sequence) {
    const bool is_list = PyList_Check(sequence);
    json_.append(is_list ? "{\"l\":[" : "{\"u\":[");
    // A list's size is read at every step: a fallback may have changed it.
    for (Py_ssize_t i = 0; i < (is_list ? PyList_GET_SIZE(sequence) : PyTuple_GET_SIZE(sequence));
         ++i) {
      Ref item =
          Ref::Borrowed(is_list ? PyList_GET_ITEM(sequence, i) : PyTuple_GET_ITEM(sequence, i));
      if (i != 0) {
        json_.push_back(',');
      }
      const size_t depth = path_.size();
      path_.push_back('/');
      AppendUnsigned(path_, static_cast<uint64_t>(i));
      const bool ok = Node(item.get());
      path_.resize(depth);
      if (!ok) {
        return false;
      }
    }
    json_.append("]}");
    return true;
  }

  // {"t": name, "dtype": d, "shape": [...]} (+ "g" and "o" for a Shard), and its descriptor.
  bool TensorLeaf(PyObject* tensor, PyObject* shard) {
#ifdef CKPTDB_NATIVE_ATEN
    if (config.aten && THPVariable_CheckExact(tensor)) {
      const int done = AtenLeaf(tensor, shard);
      if (done != 0) {
        return done > 0;
      }
    }
#endif
    return AttributeLeaf(tensor, shard);
  }

#ifdef CKPTDB_NATIVE_ATEN
  // A torch.Tensor or nn.Parameter read through ATen, with no Python object made: 1 put, -1 a
  // Python error set, 0 anything unusual (another dtype or device, a negative view, not
  // contiguous, more dimensions than a shard has, an ATen error), which AttributeLeaf then
  // handles or refuses with the Python walk's message.
  int AtenLeaf(PyObject* tensor, PyObject* shard) {
    ckptdb_tensor_info info{};
    PyObject* row = nullptr;
    uint64_t nbytes = 0;
    uintptr_t data = 0;
    bool on_cuda = false;
    try {
      const at::Tensor& t = THPVariable_Unpack(tensor);
      const auto type = static_cast<size_t>(t.scalar_type());
      row = type < config.aten_rows.size() ? config.aten_rows[type] : nullptr;
      on_cuda = t.is_cuda();
      if (row == nullptr || !(on_cuda || t.is_cpu()) || t.is_neg() || !t.is_contiguous()) {
        return 0;
      }
      const c10::IntArrayRef sizes = t.sizes();
      if (sizes.size() > CKPTDB_MAX_DIMS) {
        return 0;
      }
      info.ndim = static_cast<uint32_t>(sizes.size());
      nbytes = static_cast<uint64_t>(t.element_size());
      for (uint32_t d = 0; d < info.ndim; ++d) {
        info.shape[d] = static_cast<uint64_t>(sizes[d]);
        if (sizes[d] < 0 || __builtin_mul_overflow(nbytes, info.shape[d], &nbytes)) {
          return 0;
        }
      }
      data = reinterpret_cast<uintptr_t>(t.data_ptr());
    } catch (const std::exception&) {
      return 0;
    }
    const Ref held_row = Ref::Borrowed(row);  // Emit runs Python code before it writes the name
    info.dtype = static_cast<int>(PyLong_AsLong(PyTuple_GET_ITEM(row, 1)));
    return Emit(tensor, PyTuple_GET_ITEM(row, 0), info, nbytes, data, on_cuda, shard) ? 1 : -1;
  }
#endif

  // Any tensor, read through its Python attributes, as the Python walk reads it.
  bool AttributeLeaf(PyObject* tensor, PyObject* shard) {
    const std::string_view name = NameView();
    Ref dtype(PyObject_GetAttr(tensor, names.dtype));
    if (!dtype) {
      return false;
    }
    // Held: Python code runs before it is used (a configure() meanwhile would free it).
    Ref row = Ref::Borrowed(PyDict_GetItemWithError(config.dtypes, dtype.get()));
    if (!row) {
      if (!PyErr_Occurred()) {
        PyErr_Format(PyExc_TypeError, "%s: tensors of %S are not supported",
                     std::string(name).c_str(), dtype.get());
      }
      return false;
    }
    const long code = PyLong_AsLong(PyTuple_GET_ITEM(row.get(), 1));
    const long element_size = PyLong_AsLong(PyTuple_GET_ITEM(row.get(), 2));
    if (PyErr_Occurred()) {
      return false;
    }
    Ref cpu(PyObject_GetAttr(tensor, names.is_cpu));  // the common case first
    if (!cpu) {
      return false;
    }
    bool on_cuda = false;
    if (cpu.get() != Py_True) {
      Ref cuda(PyObject_GetAttr(tensor, names.is_cuda));
      if (!cuda) {
        return false;
      }
      on_cuda = cuda.get() == Py_True;
      if (!on_cuda) {
        Ref device(PyObject_GetAttr(tensor, names.device));
        if (device) {
          PyErr_Format(PyExc_ValueError, "%s: a tensor on %S; move it to the CPU", Name().c_str(),
                       device.get());
        }
        return false;
      }
    }
    // Its memory is read by address, never through autograd: a contiguous tensor is held as it
    // is, another is copied (detach().contiguous(), the copy held until capture ends). A
    // negative view (is_neg(): its memory holds the values before the negation, as
    // complex.conj().imag gives) is resolved into a copy first.
    Ref held = Ref::Borrowed(tensor);
    Ref negative(PyObject_CallMethodNoArgs(tensor, names.is_neg));
    if (!negative) {
      return false;
    }
    if (negative.get() == Py_True) {
      held = Ref(PyObject_CallMethodNoArgs(tensor, names.resolve_neg));
      if (!held) {
        return false;
      }
    }
    Ref contiguous(PyObject_CallMethodNoArgs(held.get(), names.is_contiguous));
    if (!contiguous) {
      return false;
    }
    if (contiguous.get() != Py_True) {
      Ref detached(PyObject_CallMethodNoArgs(held.get(), names.detach));
      if (!detached) {
        return false;
      }
      held = Ref(PyObject_CallMethodNoArgs(detached.get(), names.contiguous));
      if (!held) {
        return false;
      }
    }
    Ref shape(PyObject_GetAttr(tensor, names.shape));
    if (!shape) {
      return false;
    }
    ckptdb_tensor_info info{};
    info.dtype = static_cast<int>(code);
    if (!ReadDims(shape.get(), name, info.shape, &info.ndim)) {
      return false;
    }
    uint64_t nbytes = static_cast<uint64_t>(element_size);
    for (uint32_t d = 0; d < info.ndim; ++d) {
      if (__builtin_mul_overflow(nbytes, info.shape[d], &nbytes)) {
        PyErr_Format(PyExc_ValueError, "%s: shape %R: its size overflows 64 bits",
                     std::string(name).c_str(), shape.get());
        return false;
      }
    }
    Ref address(PyObject_CallMethodNoArgs(held.get(), names.data_ptr));
    if (!address) {
      return false;
    }
    const unsigned long long data = PyLong_AsUnsignedLongLong(address.get());
    if (data == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
      return false;
    }
    return Emit(held.get(), PyTuple_GET_ITEM(row.get(), 0), info, nbytes,
                static_cast<uintptr_t>(data), on_cuda, shard, held.get() != tensor);
  }

  // The tensor's descriptor and node, `held` kept alive until capture ends; a Shard's place.
  bool Emit(PyObject* held, PyObject* dtype_name, ckptdb_tensor_info& info, uint64_t nbytes,
            uintptr_t data, bool on_cuda, PyObject* shard, bool copied = false) {
    const std::string_view name = NameView();
    if (shard != nullptr) {
      Ref global_shape(PyObject_GetAttr(shard, names.global_shape));
      Ref offset(global_shape ? PyObject_GetAttr(shard, names.offset) : nullptr);
      if (!offset) {
        return false;
      }
      uint32_t global_ndim = 0;
      uint32_t offset_ndim = 0;
      if (!ReadDims(global_shape.get(), name, info.global_shape, &global_ndim) ||
          !ReadDims(offset.get(), name, info.global_offset, &offset_ndim)) {
        return false;
      }
      if (global_ndim != info.ndim || offset_ndim != info.ndim) {
        PyErr_Format(PyExc_ValueError,
                     "%s: a Shard's global_shape %R and offset %R need %u "
                     "entries, one a dimension of its tensor",
                     std::string(name).c_str(), global_shape.get(), offset.get(), info.ndim);
        return false;
      }
    }
    if (std::memchr(name.data(), '\0', name.size()) != nullptr) {
      Ref text(PyUnicode_DecodeUTF8(name.data(), static_cast<Py_ssize_t>(name.size()), nullptr));
      if (text) {
        PyErr_Format(PyExc_ValueError, "name %R contains a NUL byte", text.get());
      }
      return false;
    }
    if (HasSurrogate(name)) {  // the Python walk's name.encode("utf-8") raises the same
      Ref text(
          PyUnicode_DecodeUTF8(name.data(), static_cast<Py_ssize_t>(name.size()), "surrogatepass"));
      if (text) {
        Ref strict(PyUnicode_AsUTF8String(text.get()));  // sets UnicodeEncodeError
        CKPTDB_NATIVE_ASSERT(!strict);
      }
      return false;
    }
    if (on_cuda && !NoteDevice(held, copied)) {
      return false;
    }
    if (PyList_Append(keep_.get(), held) != 0) {
      return false;
    }
    entries_.push_back(Entry{names_.size(), data, nbytes, on_cuda ? CKPTDB_PUT_DEVICE : 0u});
    names_.append(name);
    names_.push_back('\0');
    infos_.push_back(info);
    const bool put_now = sink_ != nullptr && entries_.size() - flushed_ >= sink_->batch;

    json_.append("{\"t\":");
    AppendJsonUtf8(json_, name);
    json_.append(",\"dtype\":");
    AppendJsonString(json_, dtype_name);
    json_.append(",\"shape\":");
    AppendDims(info.shape, info.ndim);
    if (shard != nullptr) {
      json_.append(",\"g\":");
      AppendDims(info.global_shape, info.ndim);
      json_.append(",\"o\":");
      AppendDims(info.global_offset, info.ndim);
    }
    json_.push_back('}');
    return !put_now || Flush(false);
  }

  void AppendDims(const uint64_t* dims, uint32_t ndim) {
    json_.push_back('[');
    for (uint32_t d = 0; d < ndim; ++d) {
      if (d != 0) {
        json_.push_back(',');
      }
      AppendUnsigned(json_, dims[d]);
    }
    json_.push_back(']');
  }

  // Each CUDA device once: the caller synchronizes its current stream before the put.
  // A copy made on the device (contiguous(), resolve_neg()) is ordered on its current stream
  // too: synchronized again before it is put.
  bool NoteDevice(PyObject* tensor, bool copied) {
    Ref device(PyObject_GetAttr(tensor, names.device));
    if (!device) {
      return false;
    }
    const int present = PySequence_Contains(devices_.get(), device.get());
    if (present < 0) {
      return false;
    }
    if (present == 1 && !copied) {
      return true;
    }
    if (sink_ != nullptr) {  // before any of its memory is put
      Ref synced(PyObject_CallOneArg(sink_->sync, device.get()));
      if (!synced) {
        return false;
      }
    }
    return present == 1 || PyList_Append(devices_.get(), device.get()) == 0;
  }

  PyObject* fallback_;
  const Sink* sink_;
  size_t flushed_ = 0;    // entries put so far
  bool put_any_ = false;  // a put was made (an error must then abort the version)
  int status_ = 0;        // the failed put's status
  Buffers* buffers_;
  std::string& json_;
  std::string& names_;
  std::vector<ckptdb_tensor_info>& infos_;
  std::vector<Entry>& entries_;
  std::string path_;
  Ref keep_;
  Ref devices_;
};

// A module function whose C++ allocations may throw: MemoryError instead of a crossing.
template <PyObject* (*Function)(PyObject*)>
PyObject* Catching(PyObject*, PyObject* args) {
  try {
    return Function(args);
  } catch (const std::bad_alloc&) {
    return PyErr_NoMemory();
  }
}

PyObject* Configure(PyObject* args) {
  PyObject* tensor_type = nullptr;
  PyObject* shard_type = nullptr;
  PyObject* dtypes = nullptr;
  const char* tree_name = nullptr;
  long tree_format = 0;
  const char* torch_version = nullptr;
  if (!PyArg_ParseTuple(args, "O!O!O!sls", &PyType_Type, &tensor_type, &PyType_Type, &shard_type,
                        &PyDict_Type, &dtypes, &tree_name, &tree_format, &torch_version)) {
    return nullptr;
  }
  PyObject* key = nullptr;
  PyObject* value = nullptr;
  Py_ssize_t position = 0;
  while (PyDict_Next(dtypes, &position, &key, &value)) {
    if (!PyTuple_Check(value) || PyTuple_GET_SIZE(value) != 3 ||
        !PyUnicode_Check(PyTuple_GET_ITEM(value, 0)) || !PyLong_Check(PyTuple_GET_ITEM(value, 1)) ||
        !PyLong_Check(PyTuple_GET_ITEM(value, 2))) {
      PyErr_Format(PyExc_TypeError, "configure: dtype %R: expected (name, code, element size)",
                   key);
      return nullptr;
    }
  }
  Py_INCREF(tensor_type);
  Py_INCREF(shard_type);
  Py_INCREF(dtypes);
  Py_XDECREF(reinterpret_cast<PyObject*>(config.tensor_type));
  Py_XDECREF(reinterpret_cast<PyObject*>(config.shard_type));
  Py_XDECREF(config.dtypes);
  config.tensor_type = reinterpret_cast<PyTypeObject*>(tensor_type);
  config.shard_type = reinterpret_cast<PyTypeObject*>(shard_type);
  config.dtypes = dtypes;
  config.tree_name = tree_name;
  config.tree_format = tree_format;
#ifdef CKPTDB_NATIVE_ATEN
  // THPVariable's layout is the headers' torch's: ATen is used only under the same major.minor.
  const std::string built =
      std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + ".";
  config.aten = std::string_view(torch_version).substr(0, built.size()) == built;
  config.aten_rows.assign(static_cast<size_t>(c10::ScalarType::NumOptions), nullptr);
  position = 0;
  while (PyDict_Next(dtypes, &position, &key, &value)) {
    if (THPDtype_Check(key)) {
      const auto type = static_cast<size_t>(reinterpret_cast<THPDtype*>(key)->scalar_type);
      if (type < config.aten_rows.size()) {
        config.aten_rows[type] = value;
      }
    }
  }
#endif
  Py_RETURN_NONE;
}

PyObject* WalkState(PyObject* args) {
  PyObject* state = nullptr;
  PyObject* rank = nullptr;
  PyObject* world_size = nullptr;
  PyObject* fallback = nullptr;
  PyObject* sink_args = Py_None;
  if (!PyArg_ParseTuple(args, "OO!O!O|O", &state, &PyLong_Type, &rank, &PyLong_Type, &world_size,
                        &fallback, &sink_args)) {
    return nullptr;
  }
  if (config.tensor_type == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "ckptdb._native.walk before configure()");
    return nullptr;
  }
  if (!PyCallable_Check(fallback)) {
    PyErr_SetString(PyExc_TypeError, "walk: the fallback must be callable");
    return nullptr;
  }
  Sink sink;
  const bool putting = sink_args != Py_None;
  if (putting) {
    unsigned long long put = 0;
    unsigned long long abort = 0;
    unsigned long long db = 0;
    unsigned long long version = 0;
    Py_ssize_t batch = 0;
    if (!PyArg_ParseTuple(sink_args, "KKKKnO;walk: sink is (put, abort, db, version, batch, sync)",
                          &put, &abort, &db, &version, &batch, &sink.sync)) {
      return nullptr;
    }
    if (put == 0 || abort == 0 || db == 0 || batch < 1 || !PyCallable_Check(sink.sync)) {
      PyErr_SetString(PyExc_ValueError,
                      "walk: the sink needs the addresses of ckptdb_put_shards and ckptdb_abort, "
                      "an open handle, a batch of at least 1 and a callable sync");
      return nullptr;
    }
    sink.put = reinterpret_cast<PutFn>(static_cast<uintptr_t>(put));
    sink.abort = reinterpret_cast<AbortFn>(static_cast<uintptr_t>(abort));
    sink.db = reinterpret_cast<void*>(static_cast<uintptr_t>(db));
    sink.version = version;
    sink.batch = static_cast<size_t>(batch);
  }
  Walk walk(fallback, putting ? &sink : nullptr);
  if (!walk.Start()) {
    return nullptr;
  }
  walk.StartNames(config.tree_name);
  std::string& json = walk.json();
  json.append("{\"format\":");
  AppendUnsigned(json, static_cast<uint64_t>(config.tree_format));
  json.append(",\"rank\":");
  if (!AppendJsonInt(json, rank)) {
    return nullptr;
  }
  json.append(",\"world_size\":");
  if (!AppendJsonInt(json, world_size)) {
    return nullptr;
  }
  json.append(",\"tree\":");
  try {
    const bool walked = walk.Node(state);
    if (walked) {
      json.push_back('}');
    }
    if (!putting) {
      return walked ? walk.Finish() : nullptr;
    }
    if ((walked && walk.Flush(/*with_record=*/true)) || walk.status() != 0) {
      return walk.FinishPut();  // the put's failure is the caller's to report (and abort)
    }
  } catch (const std::bad_alloc&) {
    PyErr_NoMemory();
  }
  walk.AbortIfPut();  // while the walk still holds what was put
  return nullptr;
}

// Whether tensors are read through ATen (built with torch's headers, for the torch running).
PyObject* UsesAten(PyObject*, PyObject*) {
#ifdef CKPTDB_NATIVE_ATEN
  return PyBool_FromLong(config.aten);
#else
  Py_RETURN_FALSE;
#endif
}

PyMethodDef methods[] = {
    {"configure", Catching<Configure>, METH_VARARGS,
     "configure(tensor_type, shard_type, dtypes, tree_name, tree_format, torch_version): once, "
     "at import."},
    {"uses_aten", UsesAten, METH_NOARGS,
     "uses_aten() -> whether tensors are read through ATen rather than their attributes."},
    {"walk", Catching<WalkState>, METH_VARARGS,
     "walk(state, rank, world_size, fallback) -> (buffers, descriptors' address, count, keep, "
     "cuda devices): the tree record and the ckptdb_put_shards descriptors of a save.\n"
     "walk(state, rank, world_size, fallback, (put, abort, db, version, batch, sync)) -> "
     "(status, keep): the same put as it walks, `batch` tensors a ckptdb_put_shards call, the "
     "record last; a put's failure returned, a Python error raised after aborting the version."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "ckptdb._native",
    "The walk of ckptdb.torch's save in native code (python/native/walk.cc).",
    -1,
    methods,
    nullptr,
    nullptr,
    nullptr,
    nullptr,
};

}  // namespace

PyMODINIT_FUNC PyInit__native() {
  if (!InternNames()) {
    return nullptr;
  }
  PyObject* created = PyModule_Create(&module);
  if (created == nullptr) {
    return nullptr;
  }
  // The layout it writes, for the loader to check against the ctypes structures.
  if (PyModule_AddIntConstant(created, "SHARD_SIZE", sizeof(ckptdb_shard)) != 0 ||
      PyModule_AddIntConstant(created, "INFO_SIZE", sizeof(ckptdb_tensor_info)) != 0) {
    Py_DECREF(created);
    return nullptr;
  }
  return created;
}
