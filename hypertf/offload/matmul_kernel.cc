// The kernel route's probe (issue 24, docs/offload.md): a CPU kernel for MatMul (float)
// registered with a higher priority than TensorFlow's own, from a library loaded with
// tf.load_op_library. It computes the product with Eigen, as TensorFlow's does, and counts
// its calls (op HypertfKernelCalls) so hypertf.offload.kernel can say which routes reach it.
// It does not offload yet: that needs the channel's client (channel.py) in C++.
#define EIGEN_USE_THREADS
#include <atomic>
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "unsupported/Eigen/CXX11/Tensor"
using namespace tensorflow;
static std::atomic<long> calls{0};
class OffloadMatMul : public OpKernel {
 public:
  explicit OffloadMatMul(OpKernelConstruction* c) : OpKernel(c) { 
    OP_REQUIRES_OK(c, c->GetAttr("transpose_a", &ta_));
    OP_REQUIRES_OK(c, c->GetAttr("transpose_b", &tb_));
  }
  void Compute(OpKernelContext* c) override {
    calls++; 
    const Tensor& a = c->input(0); const Tensor& b = c->input(1);
    int64_t m = a.dim_size(ta_ ? 1 : 0), n = b.dim_size(tb_ ? 0 : 1);
    Tensor* out = nullptr;
    OP_REQUIRES_OK(c, c->allocate_output(0, TensorShape({m, n}), &out));
    Eigen::array<Eigen::IndexPair<int>, 1> dims = {Eigen::IndexPair<int>(ta_ ? 0 : 1, tb_ ? 1 : 0)};
    out->matrix<float>().device(c->eigen_device<Eigen::ThreadPoolDevice>()) =
        a.matrix<float>().contract(b.matrix<float>(), dims);
  }
 private:
  bool ta_, tb_;
};
REGISTER_KERNEL_BUILDER(Name("MatMul").Device(DEVICE_CPU).TypeConstraint<float>("T").Priority(100),
                        OffloadMatMul);
REGISTER_OP("HypertfKernelCalls").Output("n: int64").SetIsStateful().SetShapeFn([](shape_inference::InferenceContext* c) { c->set_output(0, c->Scalar()); return absl::OkStatus(); });
class Count : public OpKernel { public: using OpKernel::OpKernel;
  void Compute(OpKernelContext* c) override { Tensor* o; OP_REQUIRES_OK(c, c->allocate_output(0, TensorShape({}), &o)); o->scalar<int64_t>()() = calls.load(); } };
REGISTER_KERNEL_BUILDER(Name("HypertfKernelCalls").Device(DEVICE_CPU), Count);
