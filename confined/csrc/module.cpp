// The parts of a TorchScript module that tch does not reach: its buffers
// (`named_buffers`), train/eval mode, the forward's schema, and saving the
// module with its trained state. Every function catches libtorch's
// exceptions and returns them as a malloc'd message (NULL on success), so
// a stranger's file can never unwind into Rust.
//
// Tensors cross as `torch::Tensor*`, the same handles torch-sys uses: tch
// takes ownership of the ones handed out and frees them with `delete`.

#include <torch/script.h>

#include <cstdlib>
#include <cstring>
#include <string>

namespace {

char *message(const std::string &s) {
  char *out = static_cast<char *>(std::malloc(s.size() + 1));
  if (out != nullptr) {
    std::memcpy(out, s.c_str(), s.size() + 1);
  }
  return out;
}

template <typename F> char *guarded(F f) {
  try {
    f();
    return nullptr;
  } catch (const c10::Error &e) {
    return message(e.what_without_backtrace());
  } catch (const std::exception &e) {
    return message(e.what());
  } catch (...) {
    return message("unknown libtorch error");
  }
}

torch::jit::Module *as_module(void *m) {
  return static_cast<torch::jit::Module *>(m);
}

} // namespace

extern "C" {

typedef void (*ty_named_cb)(void *data, const char *name, torch::Tensor *t);

void ty_free_message(char *m) { std::free(m); }

char *ty_load(const char *path, int device, void **out) {
  return guarded([&] {
    c10::Device d = device < 0 ? c10::Device(c10::kCPU)
                               : c10::Device(c10::kCUDA, device);
    *out = new torch::jit::Module(torch::jit::load(path, d));
  });
}

void ty_free(void *m) { delete as_module(m); }

char *ty_named(void *m, int buffers, void *data, ty_named_cb f) {
  return guarded([&] {
    if (buffers != 0) {
      for (const auto &b : as_module(m)->named_buffers(true)) {
        f(data, b.name.c_str(), new torch::Tensor(b.value));
      }
    } else {
      for (const auto &p : as_module(m)->named_parameters(true)) {
        f(data, p.name.c_str(), new torch::Tensor(p.value));
      }
    }
  });
}

char *ty_train(void *m, int on) {
  return guarded([&] { as_module(m)->train(on != 0); });
}

char *ty_forward_schema(void *m, char **schema, char **names,
                        int *tensor_args, int *args, int *returns_tensor) {
  return guarded([&] {
    auto method = as_module(m)->get_method("forward");
    const auto &s = method.function().getSchema();
    std::ostringstream text;
    text << s;
    *schema = message(text.str());
    // The argument names after `self`, one per line.
    std::ostringstream arg_names;
    for (size_t i = 1; i < s.arguments().size(); ++i) {
      arg_names << s.arguments()[i].name() << "\n";
    }
    *names = message(arg_names.str());
    // The first argument is the module itself.
    int n = static_cast<int>(s.arguments().size()) - 1;
    int t = 0;
    for (size_t i = 1; i < s.arguments().size(); ++i) {
      if (s.arguments()[i].type()->kind() == c10::TypeKind::TensorType) {
        t += 1;
      }
    }
    *args = n;
    *tensor_args = t;
    *returns_tensor =
        s.returns().size() == 1 &&
        s.returns()[0].type()->kind() == c10::TypeKind::TensorType;
  });
}

char *ty_forward(void *m, torch::Tensor *x, torch::Tensor **out) {
  return guarded([&] {
    c10::IValue v = as_module(m)->forward({*x});
    if (!v.isTensor()) {
      throw std::runtime_error("the forward returned " + v.tagKind() +
                               ", not a tensor");
    }
    *out = new torch::Tensor(v.toTensor());
  });
}

char *ty_forward_many(void *m, torch::Tensor **xs, int n, torch::Tensor **out) {
  return guarded([&] {
    std::vector<c10::IValue> inputs;
    inputs.reserve(n);
    for (int i = 0; i < n; ++i) {
      inputs.emplace_back(*xs[i]);
    }
    c10::IValue v = as_module(m)->forward(inputs);
    if (!v.isTensor()) {
      throw std::runtime_error("the forward returned " + v.tagKind() +
                               ", not a tensor");
    }
    *out = new torch::Tensor(v.toTensor());
  });
}

char *ty_save(void *m, const char *path) {
  return guarded([&] { as_module(m)->save(path); });
}

} // extern "C"
