import jax, jax.numpy as jnp
import jaxremat

N, B, T, D = 24, 8, 2048, 2048                     # 24 layers, 0.8B parameters: never allocated
def block(p, x, _):                                # your own layer: a residual MLP
    return x + jax.nn.gelu(x @ p["w_in"]) @ p["w_out"]
def loss(plan, params, x):                         # your loss, the plan given to remat_scan
    return jnp.mean(jaxremat.remat_scan(block, params, x, plan.schedule, policy=plan.policy) ** 2)

params = {"w_in": jax.ShapeDtypeStruct((N, D, 4 * D), jnp.float32),
          "w_out": jax.ShapeDtypeStruct((N, 4 * D, D), jnp.float32)}
x = jax.ShapeDtypeStruct((B, T, D), jnp.float32)
for row in jaxremat.estimate(loss, params, x, plans=["none", "every_k(2)", "sqrt", "full"]):
    print(f"{row.plan:11} peak {row.peak_bytes / 2**30:5.1f} GiB  temp {row.temp_bytes / 2**30:5.1f} GiB")
