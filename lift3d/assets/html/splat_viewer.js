// lift3d's one-file splat viewer: the .splat records embedded in the page (base64), drawn with WebGL2 as screen-space
// Gaussians (each 3D covariance projected through the camera's Jacobian), sorted back to front after every move.
// Drag to orbit, wheel (or pinch) to zoom. VIEW comes from the page: {center, distance, fovy_deg, elevation_deg, background}.
(function () {
  "use strict";
  const canvas = document.getElementById("view");
  const gl = canvas.getContext("webgl2", { antialias: false, premultipliedAlpha: true, preserveDrawingBuffer: true });
  if (!gl) { document.getElementById("info").textContent = "this browser has no WebGL2"; return; }
  const text = atob(document.getElementById("splats").textContent.trim());
  const raw = new Uint8Array(text.length);
  for (let i = 0; i < text.length; i++) raw[i] = text.charCodeAt(i);
  const n = raw.length / 32, f32 = new Float32Array(raw.buffer);
  const centers = new Float32Array(3 * n), covA = new Float32Array(3 * n), covB = new Float32Array(3 * n);
  const colors = new Uint8Array(4 * n);
  for (let i = 0; i < n; i++) {
    const p = 8 * i, b = 32 * i;
    centers.set(f32.subarray(p, p + 3), 3 * i);
    const sx = f32[p + 3], sy = f32[p + 4], sz = f32[p + 5];
    colors.set(raw.subarray(b + 24, b + 28), 4 * i);
    let w = (raw[b + 28] - 128) / 128, x = (raw[b + 29] - 128) / 128, y = (raw[b + 30] - 128) / 128, z = (raw[b + 31] - 128) / 128;
    const q = Math.hypot(w, x, y, z) || 1; w /= q; x /= q; y /= q; z /= q;
    const r = [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y),
      2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x),
      2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)];
    const m = [r[0] * sx, r[1] * sy, r[2] * sz, r[3] * sx, r[4] * sy, r[5] * sz, r[6] * sx, r[7] * sy, r[8] * sz];
    const dot = (i0, j0) => m[3 * i0] * m[3 * j0] + m[3 * i0 + 1] * m[3 * j0 + 1] + m[3 * i0 + 2] * m[3 * j0 + 2];
    covA.set([dot(0, 0), dot(0, 1), dot(0, 2)], 3 * i);
    covB.set([dot(1, 1), dot(1, 2), dot(2, 2)], 3 * i);
  }

  const vertexSource = `#version 300 es
  precision highp float;
  in vec2 corner; in vec3 center; in vec3 covA; in vec3 covB; in vec4 color;
  uniform mat4 view, projection; uniform vec2 focal, viewport;
  out vec4 vColor; out vec2 vCorner;
  void main() {
    vec4 cam = view * vec4(center, 1.0);
    vec4 clip = projection * cam;
    float bound = 1.2 * clip.w;
    if (cam.z > -1e-4 || abs(clip.x) > bound || abs(clip.y) > bound) { gl_Position = vec4(0.0, 0.0, 2.0, 1.0); return; }
    mat3 sigma = mat3(covA.x, covA.y, covA.z, covA.y, covB.x, covB.y, covA.z, covB.y, covB.z);
    float z = -cam.z;
    mat3 jacobian = mat3(focal.x / z, 0.0, 0.0, 0.0, focal.y / z, 0.0, focal.x * cam.x / (z * z), focal.y * cam.y / (z * z), 0.0);
    mat3 t = jacobian * mat3(view);
    mat3 cov = t * sigma * transpose(t);
    float a = cov[0][0] + 0.3, b = cov[0][1], d = cov[1][1] + 0.3;
    float mid = 0.5 * (a + d), radius = length(vec2(0.5 * (a - d), b));
    float l1 = mid + radius, l2 = max(mid - radius, 0.01);
    vec2 axis = abs(b) > 1e-9 ? normalize(vec2(b, l1 - a)) : (a >= d ? vec2(1.0, 0.0) : vec2(0.0, 1.0));
    vec2 offset = corner.x * min(sqrt(l1), 2048.0) * axis + corner.y * min(sqrt(l2), 2048.0) * vec2(-axis.y, axis.x);
    gl_Position = vec4(clip.xy / clip.w + 2.0 * offset / viewport, 0.0, 1.0);
    vColor = color; vCorner = corner;
  }`;
  const fragmentSource = `#version 300 es
  precision highp float;
  in vec4 vColor; in vec2 vCorner; out vec4 fragColor;
  void main() {
    float r = dot(vCorner, vCorner);
    if (r > 9.0) discard;
    float alpha = min(0.99, exp(-0.5 * r) * vColor.a);
    if (alpha < 1.0 / 255.0) discard;
    fragColor = vec4(vColor.rgb * alpha, alpha);
  }`;
  function shader(type, source) {
    const s = gl.createShader(type);
    gl.shaderSource(s, source); gl.compileShader(s);
    if (!gl.getShaderParameter(s, gl.COMPILE_STATUS)) throw new Error(gl.getShaderInfoLog(s));
    return s;
  }
  const program = gl.createProgram();
  gl.attachShader(program, shader(gl.VERTEX_SHADER, vertexSource));
  gl.attachShader(program, shader(gl.FRAGMENT_SHADER, fragmentSource));
  gl.linkProgram(program);
  if (!gl.getProgramParameter(program, gl.LINK_STATUS)) throw new Error(gl.getProgramInfoLog(program));
  gl.useProgram(program);

  function attribute(name, size, type, normalized, divisor, data) {
    const buffer = gl.createBuffer(), where = gl.getAttribLocation(program, name);
    gl.bindBuffer(gl.ARRAY_BUFFER, buffer);
    if (data) gl.bufferData(gl.ARRAY_BUFFER, data, gl.STATIC_DRAW);
    gl.enableVertexAttribArray(where);
    gl.vertexAttribPointer(where, size, type, normalized, 0, 0);
    gl.vertexAttribDivisor(where, divisor);
    return buffer;
  }
  attribute("corner", 2, gl.FLOAT, false, 0, new Float32Array([-3, -3, 3, -3, -3, 3, 3, 3]));
  const buffers = [[attribute("center", 3, gl.FLOAT, false, 1), centers, 3], [attribute("covA", 3, gl.FLOAT, false, 1), covA, 3],
    [attribute("covB", 3, gl.FLOAT, false, 1), covB, 3], [attribute("color", 4, gl.UNSIGNED_BYTE, true, 1), colors, 4]];
  const uniform = (name) => gl.getUniformLocation(program, name);

  const center = VIEW.center;
  let azimuth = 0, elevation = VIEW.elevation_deg * Math.PI / 180, distance = VIEW.distance, dirty = true;
  const order = new Uint32Array(n).map((_, i) => i), depth = new Float32Array(n);

  function viewMatrix() {
    const eye = [center[0] + distance * Math.cos(elevation) * Math.cos(azimuth),
      center[1] + distance * Math.cos(elevation) * Math.sin(azimuth), center[2] + distance * Math.sin(elevation)];
    const norm = (v) => { const l = Math.hypot(v[0], v[1], v[2]) || 1; return [v[0] / l, v[1] / l, v[2] / l]; };
    const cross = (u, v) => [u[1] * v[2] - u[2] * v[1], u[2] * v[0] - u[0] * v[2], u[0] * v[1] - u[1] * v[0]];
    const dot = (u, v) => u[0] * v[0] + u[1] * v[1] + u[2] * v[2];
    const f = norm([center[0] - eye[0], center[1] - eye[1], center[2] - eye[2]]);
    const s = norm(cross(f, [0, 0, 1])), u = cross(s, f);
    return new Float32Array([s[0], u[0], -f[0], 0, s[1], u[1], -f[1], 0, s[2], u[2], -f[2], 0, -dot(s, eye), -dot(u, eye), dot(f, eye), 1]);
  }

  function draw() {
    dirty = false;
    const dpr = window.devicePixelRatio || 1;
    const width = Math.max(1, Math.round(canvas.clientWidth * dpr)), height = Math.max(1, Math.round(canvas.clientHeight * dpr));
    if (canvas.width !== width || canvas.height !== height) { canvas.width = width; canvas.height = height; }
    const view = viewMatrix(), near = distance * 0.01, far = distance * 100;
    const fy = 0.5 * height / Math.tan(VIEW.fovy_deg * Math.PI / 360), ty = 1 / Math.tan(VIEW.fovy_deg * Math.PI / 360);
    const projection = new Float32Array([ty * height / width, 0, 0, 0, 0, ty, 0, 0, 0, 0, (far + near) / (near - far), -1,
      0, 0, 2 * far * near / (near - far), 0]);
    for (let i = 0; i < n; i++) depth[i] = view[2] * centers[3 * i] + view[6] * centers[3 * i + 1] + view[10] * centers[3 * i + 2];
    order.sort((a, b) => depth[a] - depth[b]);  // most negative camera z (farthest) first: drawn back to front
    for (const [buffer, source, size] of buffers) {
      const sorted = new source.constructor(source.length);
      for (let k = 0; k < n; k++) sorted.set(source.subarray(size * order[k], size * order[k] + size), size * k);
      gl.bindBuffer(gl.ARRAY_BUFFER, buffer);
      gl.bufferData(gl.ARRAY_BUFFER, sorted, gl.DYNAMIC_DRAW);
    }
    gl.viewport(0, 0, width, height);
    const bg = VIEW.background;
    gl.clearColor(bg[0], bg[1], bg[2], 1);
    gl.clear(gl.COLOR_BUFFER_BIT);
    gl.enable(gl.BLEND);
    gl.blendFunc(gl.ONE, gl.ONE_MINUS_SRC_ALPHA);
    gl.uniformMatrix4fv(uniform("view"), false, view);
    gl.uniformMatrix4fv(uniform("projection"), false, projection);
    gl.uniform2f(uniform("focal"), fy, fy);
    gl.uniform2f(uniform("viewport"), width, height);
    gl.drawArraysInstanced(gl.TRIANGLE_STRIP, 0, 4, n);
    window.lift3dFrames = (window.lift3dFrames || 0) + 1;
  }
  function frame() { if (dirty) draw(); requestAnimationFrame(frame); }

  let dragging = null;
  canvas.addEventListener("pointerdown", (e) => { dragging = [e.clientX, e.clientY]; canvas.setPointerCapture(e.pointerId); });
  canvas.addEventListener("pointerup", () => { dragging = null; });
  canvas.addEventListener("pointermove", (e) => {
    if (!dragging) return;
    azimuth -= (e.clientX - dragging[0]) * 0.01;
    elevation = Math.max(-1.5, Math.min(1.5, elevation + (e.clientY - dragging[1]) * 0.01));
    dragging = [e.clientX, e.clientY]; dirty = true;
  });
  canvas.addEventListener("wheel", (e) => { e.preventDefault(); distance *= Math.exp(e.deltaY * 0.001); dirty = true; }, { passive: false });
  window.addEventListener("resize", () => { dirty = true; });
  document.getElementById("info").textContent += ` · ${n} Gaussians`;
  requestAnimationFrame(frame);
})();
