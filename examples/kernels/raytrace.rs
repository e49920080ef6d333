//! A small ray tracer: a few spheres on a checkered floor, one point light, hard shadows,
//! Phong highlights and mirror reflections, with `samples × samples` supersampling per pixel.
//!
//! One iteration renders one image row into a caller-provided slice of `3 × width` RGB bytes.
//! The math is plain `f64` with no randomness, so a row is the same whoever renders it.

use std::io::{self, Write};
use std::ops::{Add, Mul, Sub};
use std::path::Path;

/// A 3-vector (points, directions and RGB colors).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct V3 {
    x: f64,
    y: f64,
    z: f64,
}

const fn v3(x: f64, y: f64, z: f64) -> V3 {
    V3 { x, y, z }
}

impl Add for V3 {
    type Output = V3;
    #[inline]
    fn add(self, o: V3) -> V3 {
        v3(self.x + o.x, self.y + o.y, self.z + o.z)
    }
}

impl Sub for V3 {
    type Output = V3;
    #[inline]
    fn sub(self, o: V3) -> V3 {
        v3(self.x - o.x, self.y - o.y, self.z - o.z)
    }
}

impl Mul<f64> for V3 {
    type Output = V3;
    #[inline]
    fn mul(self, s: f64) -> V3 {
        v3(self.x * s, self.y * s, self.z * s)
    }
}

impl V3 {
    #[inline]
    fn dot(self, o: V3) -> f64 {
        self.x * o.x + self.y * o.y + self.z * o.z
    }

    #[inline]
    fn norm(self) -> V3 {
        self * (1.0 / self.dot(self).sqrt())
    }

    /// Component-wise product (a color filtered by a color).
    #[inline]
    fn times(self, o: V3) -> V3 {
        v3(self.x * o.x, self.y * o.y, self.z * o.z)
    }
}

/// A sphere with a color and a reflectivity in `[0, 1]`.
#[derive(Debug, Clone, Copy)]
struct Sphere {
    center: V3,
    radius: f64,
    color: V3,
    reflect: f64,
}

/// The floor: the plane `y = FLOOR_Y`, checkered.
const FLOOR_Y: f64 = -0.5;
const FLOOR_REFLECT: f64 = 0.15;
/// Offset of secondary rays from the surface they leave.
const EPS: f64 = 1e-6;
/// Reflection bounces after the primary ray.
const MAX_DEPTH: u32 = 3;

/// The scene and the camera: everything needed to render a row.
#[derive(Debug, Clone)]
pub(crate) struct Scene {
    width: u32,
    height: u32,
    samples: u32,
    spheres: [Sphere; 5],
    light: V3,
    eye: V3,
    /// `tan(fov / 2)`.
    half_fov: f64,
}

/// What a ray hit: distance, point, normal, color, reflectivity.
struct Hit {
    t: f64,
    normal: V3,
    color: V3,
    reflect: f64,
}

impl Scene {
    /// The demo scene at `width × height` with `samples²` rays per pixel.
    pub(crate) fn new(width: u32, height: u32, samples: u32) -> Scene {
        let sphere = |c: V3, radius, color, reflect| Sphere {
            center: c,
            radius,
            color,
            reflect,
        };
        Scene {
            width,
            height,
            samples: samples.max(1),
            spheres: [
                sphere(v3(0.0, 0.1, -3.0), 0.6, v3(0.9, 0.2, 0.2), 0.25),
                sphere(v3(-1.35, 0.0, -3.6), 0.5, v3(0.2, 0.8, 0.3), 0.1),
                sphere(v3(1.35, 0.0, -3.6), 0.5, v3(0.85, 0.85, 0.9), 0.8),
                sphere(v3(-0.45, -0.3, -2.1), 0.2, v3(0.2, 0.3, 0.95), 0.3),
                sphere(v3(0.55, -0.35, -2.0), 0.15, v3(0.95, 0.8, 0.1), 0.0),
            ],
            light: v3(-3.0, 4.0, 1.0),
            eye: v3(0.0, 0.25, 0.5),
            half_fov: (30.0f64).to_radians().tan(),
        }
    }

    /// Image width in pixels.
    pub(crate) fn width(&self) -> u32 {
        self.width
    }

    /// Image height in pixels (the number of rows).
    pub(crate) fn height(&self) -> u32 {
        self.height
    }

    /// Bytes of one row: `3 × width`.
    pub(crate) fn row_bytes(&self) -> usize {
        3 * self.width as usize
    }

    /// Renders row `y` (0 = top) into `out` (`row_bytes()` long) as RGB bytes.
    #[inline]
    pub(crate) fn render_row(&self, y: u32, out: &mut [u8]) {
        assert_eq!(out.len(), self.row_bytes(), "render_row: wrong row length");
        let (w, h, s) = (
            f64::from(self.width),
            f64::from(self.height),
            f64::from(self.samples),
        );
        let aspect = w / h;
        for (x, px) in out.chunks_exact_mut(3).enumerate() {
            let mut c = v3(0.0, 0.0, 0.0);
            for sy in 0..self.samples {
                for sx in 0..self.samples {
                    let fx = (x as f64 + (f64::from(sx) + 0.5) / s) / w;
                    let fy = (f64::from(y) + (f64::from(sy) + 0.5) / s) / h;
                    let dir = v3(
                        (2.0 * fx - 1.0) * aspect * self.half_fov,
                        (1.0 - 2.0 * fy) * self.half_fov,
                        -1.0,
                    )
                    .norm();
                    c = c + self.trace(self.eye, dir);
                }
            }
            let c = c * (1.0 / (s * s));
            // Gamma 2 and 8-bit quantization.
            px[0] = to_byte(c.x);
            px[1] = to_byte(c.y);
            px[2] = to_byte(c.z);
        }
    }

    /// The color seen along the ray `o + t·d`, following reflections.
    #[inline]
    fn trace(&self, mut o: V3, mut d: V3) -> V3 {
        let mut color = v3(0.0, 0.0, 0.0);
        let mut weight = 1.0;
        for depth in 0..=MAX_DEPTH {
            let Some(hit) = self.nearest(o, d, f64::INFINITY) else {
                // Sky: white at the horizon to blue at the zenith.
                let t = 0.5 * (d.y + 1.0);
                let sky = v3(1.0, 1.0, 1.0) * (1.0 - t) + v3(0.45, 0.65, 1.0) * t;
                return color + sky * weight;
            };
            let p = o + d * hit.t;
            let start = p + hit.normal * EPS;
            let to_light = self.light - p;
            let dist = to_light.dot(to_light).sqrt();
            let l = to_light * (1.0 / dist);
            let lit = self.nearest(start, l, dist).is_none();
            let (mut diffuse, mut spec) = (0.0, 0.0);
            if lit {
                diffuse = hit.normal.dot(l).max(0.0);
                // Phong: the light's mirror direction against the direction to the eye.
                let r = l - hit.normal * (2.0 * hit.normal.dot(l));
                spec = r.dot(d).max(0.0).powi(32);
            }
            let local = hit.color * (0.1 + 0.9 * diffuse) + v3(1.0, 1.0, 1.0) * (0.6 * spec);
            if hit.reflect == 0.0 || depth == MAX_DEPTH {
                return color + local * weight;
            }
            color = color + local * (weight * (1.0 - hit.reflect));
            weight *= hit.reflect;
            d = d - hit.normal * (2.0 * hit.normal.dot(d));
            o = start;
        }
        color
    }

    /// The nearest hit along `o + t·d` with `EPS < t < max`.
    #[inline]
    fn nearest(&self, o: V3, d: V3, max: f64) -> Option<Hit> {
        let mut best: Option<(f64, usize)> = None;
        let mut tmax = max;
        for (i, s) in self.spheres.iter().enumerate() {
            // |o + t·d − c|² = r² with |d| = 1: t² + 2bt + c = 0.
            let oc = o - s.center;
            let b = oc.dot(d);
            let c = oc.dot(oc) - s.radius * s.radius;
            let disc = b * b - c;
            if disc < 0.0 {
                continue;
            }
            let sq = disc.sqrt();
            let t = if -b - sq > EPS { -b - sq } else { -b + sq };
            if t > EPS && t < tmax {
                tmax = t;
                best = Some((t, i));
            }
        }
        if d.y < 0.0 {
            let t = (FLOOR_Y - o.y) / d.y;
            if t > EPS && t < tmax {
                let p = o + d * t;
                let check = ((p.x * 2.0).floor() + (p.z * 2.0).floor()) as i64 & 1 == 0;
                let color = if check {
                    v3(0.9, 0.9, 0.9)
                } else {
                    v3(0.15, 0.15, 0.2)
                };
                return Some(Hit {
                    t,
                    normal: v3(0.0, 1.0, 0.0),
                    color,
                    reflect: FLOOR_REFLECT,
                });
            }
        }
        best.map(|(t, i)| {
            let s = &self.spheres[i];
            let p = o + d * t;
            Hit {
                t,
                normal: (p - s.center) * (1.0 / s.radius),
                color: s.color,
                reflect: s.reflect,
            }
        })
    }
}

/// A linear intensity to a gamma-2 byte.
#[inline]
fn to_byte(x: f64) -> u8 {
    (x.clamp(0.0, 1.0).sqrt() * 255.0 + 0.5) as u8
}

/// The sequential reference: every row in order.
pub(crate) fn sequential(scene: &Scene) -> Vec<u8> {
    let row = scene.row_bytes();
    let mut img = vec![0u8; row * scene.height() as usize];
    for (y, out) in img.chunks_exact_mut(row).enumerate() {
        scene.render_row(y as u32, out);
    }
    img
}

/// Writes `rgb` (rows top to bottom) as a binary PPM (P6) file.
pub(crate) fn write_ppm(path: &Path, width: u32, height: u32, rgb: &[u8]) -> io::Result<()> {
    let mut f = io::BufWriter::new(std::fs::File::create(path)?);
    write!(f, "P6\n{width} {height}\n255\n")?;
    f.write_all(rgb)?;
    f.flush()
}
