//! `hello-world-weather`: every Peregrine command for the weather application.

fn main() -> std::process::ExitCode {
    peregrine::main(hello_world_weather::WeatherApp)
}
