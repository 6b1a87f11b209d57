"""The diagnoses of the training chapter: the loss (cross-entropy with padding, label smoothing),
the learning-rate schedule (the paper's warmup schedule and cosine with warmup) and a training
step."""

from handformer.check.catalog.base import Diagnosis, d

DIAGNOSES: list[Diagnosis] = [
    d("loss_counts_padding", "padding is counted in the loss, or in the number it is divided by",
      "填充算进了损失，或者算进了除数",
      "leave the pad targets out of both: F.cross_entropy(..., ignore_index=pad_idx), or a mask "
      "real = targets != pad_idx with (loss * real).sum() / real.sum()",
      "损失和除数里都不要算填充：F.cross_entropy(..., ignore_index=pad_idx)，或者用掩码 "
      "real = targets != pad_idx，再算 (loss * real).sum() / real.sum()",
      r"numel\(\)", r"\.mean\(\)", r"cross_entropy\((?!.*ignore_index)",
      r"^(?!.*\*\s*\w*(weight|mask)).*\.mean\(\s*(dim\s*=\s*)?1\s*\)",  # d2l's per-row mean, unweighted
      r"^\s*\w*loss\w*\s*=\s*[\w.]+\.sum\(\s*\)",  # every position's loss summed as it is, pads kept
      r"return"),
    d("loss_mean_over_batch", "the loss is divided by the batch size, not by the number of tokens",
      "损失除以的是 batch 大小，而不是 token 数",
      "divide the summed loss by the number of real tokens, so long and short batches weigh each token "
      "the same", "把求和后的损失除以真实 token 的个数，这样长短不同的 batch 里每个 token 的权重一样",
      r"size\(0\)|shape\[0\]|len\(", r"return"),
    d("smoothing_on_pad", "label smoothing puts probability on the pad token",
      "标签平滑把概率分给了填充 token",
      "with the smoothing spread over V - 2 tokens, set the pad token's column to 0: "
      "true_dist[:, padding_idx] = 0 (else the distribution sums to more than 1)",
      "平滑的概率分给 V - 2 个 token 时，要把填充 token 那一列置 0：true_dist[:, padding_idx] = 0"
      "（否则分布之和大于 1）",
      r"scatter_?\(", r"fill_?\(|full_like|/\s*\(?\s*(self\.)?size\s*-\s*2", r"smooth"),
    d("loss_log_zero", "log(0) in a hand-written KL divergence gives NaN (0 * log 0)",
      "手写的 KL 散度里出现 log(0)，得到 NaN（0 * log 0）",
      "use nn.KLDivLoss (it takes 0 * log 0 as 0), or torch.xlogy(q, q) for q * log q",
      "用 nn.KLDivLoss（它把 0 * log 0 当作 0），或者用 torch.xlogy(q, q) 计算 q * log q",
      r"\.log\(\)|torch\.log\(", r"log"),
    d("schedule_step_zero", "the schedule divides by zero, or gives 0, at step 0",
      "调度在步 0 除以零，或者得到 0",
      "step 0 is where LambdaLR starts: use max(step, 1) (the Annotated Transformer's `if step == 0: "
      "step = 1`), or count from 1 with step + 1",
      "LambdaLR 从步 0 开始：用 max(step, 1)（Annotated Transformer 的 `if step == 0: step = 1`），"
      "或者用 step + 1 从 1 开始数",
      r"\*\*\s*\(?\s*-\s*0?\.5", r"min\(", r"return"),
    d("schedule_warmup_off_by_one", "the warmup is off by one: the peak is one step early or late",
      "预热差了一步：峰值早了或晚了一步",
      "the learning rate peaks at step warmup: min(step^-0.5, step * warmup^-1.5) has its two terms "
      "equal there; with cosine, the warmup ends and the decay starts at the same warmup",
      "学习率应在步 warmup 达到峰值：min(step^-0.5, step * warmup^-1.5) 的两项在那里相等；"
      "余弦调度的预热结束和衰减开始都用同一个 warmup",
      r"warmup\w*\s*=\s*warmup\w*\s*[-+]", r"warmup\w*\s*[-+]\s*1", r"warmup"),
    d("schedule_exponent_sign", "an exponent of the schedule has the wrong sign",
      "调度里某个指数的符号反了",
      "lrate = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5): every exponent is negative",
      "lrate = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)：每个指数都是负的",
      r"\*\*\s*\(?\s*\+?\s*[01]?\.5\b", r"\*\*", r"sqrt\("),
    d("schedule_no_d_model", "the d_model^-0.5 factor is missing", "缺少 d_model^-0.5 这个因子",
      "multiply by d_model ** -0.5: the peak learning rate shrinks as the model grows",
      "乘上 d_model ** -0.5：模型越宽，峰值学习率越小",
      r"min\(", r"return"),
    d("cosine_from_step_zero", "the cosine counts from step 0, not from the end of the warmup",
      "余弦从步 0 开始算，而不是从预热结束开始",
      "progress = (t - warmup) / (total - warmup), so the decay starts at max_lr right after the warmup",
      "progress = (t - warmup) / (total - warmup)，这样预热一结束就从 max_lr 开始衰减",
      r"(progress|ratio|decay_ratio)\s*=",
      r"/\s*\(?\s*(?:float\(\s*)?(?:max\(\s*1\s*,\s*)?[\w.]+\s*-\s*[\w.]*warm",  # over (total - warmup)
      r"cos\(", r"math\.pi"),
    d("cosine_no_floor", "past the end of the cosine the learning rate rises again",
      "余弦结束之后学习率又升了回去",
      "after step total return min_lr (the cosine's second half would climb back to max_lr)",
      "超过 total 步之后返回 min_lr（余弦的后半段会重新升回 max_lr）",
      r"(progress|ratio|decay_ratio)\s*=", r"cos\(", r"return"),
    d("cosine_min_lr_ignored", "the cosine decays to 0, not to min_lr", "余弦衰减到了 0，而不是 min_lr",
      "min_lr + 0.5 * (max_lr - min_lr) * (1 + cos(pi * progress))",
      "min_lr + 0.5 * (max_lr - min_lr) * (1 + cos(pi * progress))",
      r"cos\(", r"return"),
    d("train_step_no_zero_grad", "the gradients are never zeroed, so each step adds the ones before it",
      "梯度从不清零，每一步都叠加了之前的梯度",
      "call optimizer.zero_grad() before loss.backward() in every step",
      "每一步在 loss.backward() 之前调用 optimizer.zero_grad()",
      r"\.zero_grad\s*$", r"backward\(", r"step\("),  # zero_grad named but not called: that line
    d("train_step_clip_after_step", "the gradient is clipped after optimizer.step(), so it clips nothing",
      "梯度裁剪放在了 optimizer.step() 之后，什么也没裁剪到",
      "clip between loss.backward() and optimizer.step(): "
      "torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)",
      "在 loss.backward() 和 optimizer.step() 之间裁剪："
      "torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)",
      r"clip_grad", r"step\("),
    d("train_step_not_clipped", "the gradient is never clipped (the clipping is skipped), so a large "
      "gradient moves the parameters by its whole size",
      "梯度从没被裁剪（裁剪被跳过了），大梯度按原样更新参数",
      "clip between loss.backward() and optimizer.step() whenever a clipping norm is set: "
      "if max_norm > 0: torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)",
      "设了裁剪范数时，在 loss.backward() 和 optimizer.step() 之间裁剪："
      "if max_norm > 0: torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)",
      r"^\s*if\b.*clip", r"clip_grad"),
    d("train_step_lr_not_set", "the schedule's learning rate is never given to the optimizer, so every step "
      "updates at the rate the optimizer was built with", "调度给出的学习率从没交给优化器，每一步都按优化器"
      "创建时的学习率更新",
      "before optimizer.step(): for group in optimizer.param_groups: group[\"lr\"] = lr",
      "在 optimizer.step() 之前：for group in optimizer.param_groups: group[\"lr\"] = lr",
      r"\.step\(", r"def "),
    d("train_step_eval_mode", "model.train() is never called, so a model left in eval mode trains without "
      "dropout", "从没调用 model.train()，停在 eval 模式的模型训练时没有 dropout",
      "call model.train() at the start of the step (or of the epoch); evaluation calls model.eval()",
      "在一步（或一个 epoch）开始时调用 model.train()；评估时才调用 model.eval()",
      r"=\s*batch\b", r"def ", r"model\("),
    d("adamw_no_bias_correction", "AdamW's moments are not bias-corrected, so the first steps have the "
      "wrong size (m and v start at 0)",
      "AdamW 的一阶、二阶矩没有做偏差校正，前几步的步长不对（m 和 v 从 0 开始）",
      "divide by the corrections before the update: m_hat = m / (1 - beta1 ** t), v_hat = v / (1 - beta2 "
      "** t), with t counted from 1",
      "更新前先除以校正项：m_hat = m / (1 - beta1 ** t)，v_hat = v / (1 - beta2 ** t)，t 从 1 开始数",
      r"_hat\w*\s*=\s*[\w.\[\]\"']+\s*(#.*)?$",
      # a step size that is the rate alone (CS336's `alpha_t = lr`, its corrections left out)
      r"^\s*(?!lr\b)\w+\s*=\s*(group\[[\"']lr[\"']\]|(self\.)?lr)\s*(#.*)?$",
      r"sqrt\(|\.sqrt\(\)", r"addcdiv"),
    d("adamw_coupled_weight_decay", "the weight decay is added to the gradient (Adam with L2), not "
      "decoupled from it as AdamW's is", "权重衰减加到了梯度上（Adam 加 L2），没有像 AdamW 那样与梯度解耦",
      "leave the gradient alone and shrink the weights apart from the Adam update: p -= lr * "
      "weight_decay * p (torch: p.mul_(1 - lr * weight_decay))",
      "梯度保持不变，在 Adam 更新之外单独缩小权重：p -= lr * weight_decay * p"
      "（torch 写作 p.mul_(1 - lr * weight_decay)）",
      r"(grad|\bg)\w*\s*(=|\+=).*(weight_decay|\bwd\b|\bdecay\b)",
      r"(grad|\bg)\w*\.add_?\(.*(weight_decay|\bwd\b)", r"(weight_decay|\bwd\b)"),
    d("adamw_eps_inside_sqrt", "eps is added inside the square root, not to it", "eps 加在了平方根里面，"
      "而不是加在平方根上", "add eps to the root: m_hat / (sqrt(v_hat) + eps)",
      "eps 加在平方根之后：m_hat / (sqrt(v_hat) + eps)",
      r"sqrt\([^)]*\+\s*[\w.]*eps|\+\s*[\w.]*eps\s*\)\.sqrt\(",
      r"sqrt\("),
    d("adamw_beta2_for_m", "the first moment m is averaged with beta2, the second moment's rate",
      "一阶矩 m 用了二阶矩的 beta2 来做滑动平均",
      "m = beta1 * m + (1 - beta1) * g; v = beta2 * v + (1 - beta2) * g * g",
      "m = beta1 * m + (1 - beta1) * g；v = beta2 * v + (1 - beta2) * g * g",
      r"^\s*[\w.\[\]'\"]*\b(m|m_t|exp_avg|avg)\b[\w\[\]'\"]*\s*=.*\b(beta2|b2)\b",
      r"\b(m|m_t|exp_avg)\w*\.mul_\(\s*[\w.]*(beta2|b2)\b"),
    d("train_step_no_shift", "the target is not shifted: the decoder's input and its labels are the same "
      "positions", "目标序列没有错开一位：解码器的输入和标签是同一组位置",
      "shift right: feed tgt[:, :-1] and compare the logits with tgt[:, 1:], so each position predicts "
      "the next token",
      "右移一位：输入 tgt[:, :-1]，用 tgt[:, 1:] 和 logits 比较，这样每个位置预测的是下一个 token",
      r"model\(", r"tgt"),
]
